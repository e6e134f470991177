"""Calibration from the measured-kernel corpus (no torch): rows into priced kernel sets,
the bounded fit, its cross-validated errors and bands, and the files it writes."""
