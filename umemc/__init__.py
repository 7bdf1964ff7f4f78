"""umemc: compile a stack of AI models into a memory budget, host configuration and a supervised runtime."""
