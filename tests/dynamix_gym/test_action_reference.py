"""The docs' action reference (``docs/hooks/docs_reference.py``, written at every ``make docs``) is the
code's: every action mode with the space an env of that mode has, every constant of
``dynamix_gym.actions`` with its value, and the envs' own Action Space sections."""

from __future__ import annotations

import ast

import gymnasium as gym
from support import docs_reference

from dynamix_gym import actions
from dynamix_gym.envs.elastic_cluster import ElasticClusterEnv
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv


def test_every_action_mode_is_listed_with_its_envs_space():
    page = docs_reference().action_page()
    for mode in actions.ACTION_MODES:
        env = gym.make("dynamix/HeteroCluster-v0", workers=4, action_mode=mode)
        assert f"| `{mode}` | `{env.action_space}` |" in page
        env.close()


def test_every_constant_of_the_actions_module_is_listed_with_its_value():
    page = docs_reference().action_page()
    constants = [name for name in vars(actions) if name.isupper()]
    assert len(constants) >= 8
    for name in constants:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{name}` |"))
        assert ast.literal_eval(row.split("|")[2].strip().strip("`")) == getattr(actions, name)


def test_the_envs_action_sections_are_their_docstrings():
    ref = docs_reference()
    page = ref.action_page()
    for env in (HeteroClusterEnv, ElasticClusterEnv):
        section = ref.docstring_section(env.__doc__, "Action Space")
        assert section and section in page
        assert ":class:" not in section and ":func:" not in section  # roles shown as code
    assert ref.docstring_section("## A\nx\n## B\ny", "A") == "x"
