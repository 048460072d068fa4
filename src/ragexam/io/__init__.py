"""Files of the run folder: CSV row logs, the manifest, atomic writes, locks, fingerprints."""
