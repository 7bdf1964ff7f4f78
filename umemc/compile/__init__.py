"""The compile stage: a plan made into what runs it (bundle.py: each worker's argv, environment, wrapper and
the host's tunables; launchers/: one module per runtime, spelling its flags)."""
