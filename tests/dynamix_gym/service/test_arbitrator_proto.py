"""The generated modules are what grpc_tools makes of arbitrator.proto today."""

from __future__ import annotations

import re
import shutil

from grpc_tools import protoc
from support import ROOT

PKG = "dynamix_gym/service"
#: Lines that name the generator's version: a newer grpcio-tools may write other numbers.
VERSIONS = [
    re.compile(r"_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)", re.S),
    re.compile(r"# Protobuf Python Version: .*"),
    re.compile(r"GRPC_GENERATED_VERSION = '.*'"),
]


def _normalised(text: str) -> str:
    for pattern in VERSIONS:
        text = pattern.sub("<version>", text)
    return text


def test_generated_code_matches_the_proto(tmp_path):
    (tmp_path / PKG).mkdir(parents=True)
    shutil.copy(ROOT / PKG / "arbitrator.proto", tmp_path / PKG / "arbitrator.proto")
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{tmp_path}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(tmp_path / PKG / "arbitrator.proto"),
        ]
    )
    assert rc == 0
    for name in ("arbitrator_pb2.py", "arbitrator_pb2_grpc.py"):
        fresh = (tmp_path / PKG / name).read_text()
        checked_in = (ROOT / PKG / name).read_text()
        assert _normalised(fresh) == _normalised(checked_in), (
            f"{PKG}/{name} is stale: regenerate it (command at the top of arbitrator.proto)"
        )
