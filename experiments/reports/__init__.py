"""Reports of the measuring apps (fidelity, calibrate, fit_hardware, fit_convergence): small markdown
helpers (:mod:`experiments.reports.markdown`) and one renderer module per report, each a few section
functions whose findings are computed from the report's data when it is rendered."""
