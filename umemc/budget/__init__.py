"""The budget stage: the plan of a stack (plan.py: ledgers, quotas, cold admission), the one eviction policy
(policy.py, which the runtime asks too), the placement on several nodes (placement.py) and the advice for a stack
that does not fit (advice.py)."""
