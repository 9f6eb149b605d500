"""What the calibrate app runs: the fits shared by both modes (:mod:`.fit`), real DDP ranks (:mod:`.real`),
a measured table (:mod:`.table`)."""
