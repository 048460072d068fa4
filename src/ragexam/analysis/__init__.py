"""What the run folder says: metrics, summaries, resampling, comparisons and calibration."""
