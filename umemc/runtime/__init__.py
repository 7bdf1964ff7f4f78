"""What `umemc up` runs: supervisord with the bundle, the enforcer, the exec wrapper, placeholders.
Reads plan.json only; never the TOML."""
