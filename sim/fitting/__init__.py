"""Fitting the simulator's models to measurements (the simulator itself imports nothing from here).

- :mod:`sim.fitting.table`: the measured step-time table (reference format) and per-pair compute times
- :mod:`sim.fitting.hardware`: compute-curve fits with leave-one-batch-out errors, :func:`fit_all`
- :mod:`sim.fitting.comm`: the communication model's fit
- :mod:`sim.fitting.step_time`: a calibrated profile's step-time fit and its held-out check
- :mod:`sim.fitting.convergence`: convergence models from the reference traces
- :mod:`sim.fitting.curves`: convergence models from measured training curves (calibration)
- :mod:`sim.fitting.tradeoff`: the ResNet-34 / CIFAR-100 accuracy trade-off
- :mod:`sim.fitting.lsq`: the deterministic multi-start least squares of the fits, and the
  step-time fits' bounds and loss scale
"""
