"""Measuring backends: profiling one for calibration (:mod:`.profiling`) and comparing a calibrated
simulator with it (:mod:`.compare`)."""
