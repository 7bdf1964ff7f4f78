"""Cheap probes of memory use, one small module per interface. Each reads a tree rooted at a
configurable path so tests can point it at fixture trees in the exact format of the real files."""
