"""Characters no generated file can carry: C0 controls, DEL, C1 controls and the Unicode line and
paragraph separators. supervisord's INI, sysctl.d and systemd environment files are line-based, so
a stack refuses them in every key and value, and the gateway in every name a client gives it."""

from __future__ import annotations

import re

CONTROL = re.compile("[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]")


def shown(text: str) -> str:
    """`text` as a terminal may show it: each control character as its escape (a record found on disk could carry
    one that moves the cursor or rewrites what the user reads)."""
    return CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def kube_name(name: str) -> str:
    """A stack, model or node name (^[a-z][a-z0-9_-]*$) as a Kubernetes object name, a DNS-1123 label: no '_'
    (it becomes '-') and no '-' at the end (it goes). The stack language refuses two models with one."""
    return name.replace("_", "-").rstrip("-")
