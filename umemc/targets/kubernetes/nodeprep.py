"""node-prep/NODE/: the host settings a manifest cannot set (sysctl, kernel arguments), each node's files and how to
apply them."""

from __future__ import annotations

from ...budget.plan import Plan
from ...compile.bundle import Bundle
from .shared import Node


def _node_prep(plan: Plan, nodes: dict[str, Node], bundles: dict[str, Bundle]) -> dict[str, str]:
    """Each node's host settings (the same files a per-node bundle has) and how to apply them; nodes whose files
    are the same (one platform) share one folder, named after the first of them (500 nodes of a few platforms
    are a few folders, not a thousand files)."""
    from ..files import kernel, sysctl

    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for name in nodes:
        keep = sysctl(bundles[name]) | kernel(bundles[name], kubernetes=True)
        groups.setdefault(tuple(sorted(keep.items())), []).append(name)
    out: dict[str, str] = {}
    lines = [
        f"# Preparing the nodes of `{plan.name}`",
        "",
        "The kubelet enforces each model's memory limit with the node's memory cgroup. What a manifest cannot",
        "set without a privileged pod is the host: the VM tunables and, on AMD APUs, the GTT limit (a kernel",
        "argument). Apply them once per node, as root, before the models are scheduled:",
        "",
    ]
    for files, names in groups.items():
        first = names[0]
        out |= {f"node-prep/{first}/{k}": v for k, v in files}
        p = nodes[first].plan.platform
        others = f" and {len(names) - 1} more node(s) with the same settings" if len(names) > 1 else ""
        lines += [f"## {first}{others} ({p.preset or p.kind}, {p.kind})", ""]
        if others:
            lines += [f"On each of: {', '.join(names)}.", ""]
        lines += [
            "```sh",
            f"sudo install -m 0644 node-prep/{first}/sysctl/90-umemc.conf /etc/sysctl.d/90-umemc.conf",
            "sudo sysctl --system",
            "```",
            "",
            f"Kernel and GPU settings: node-prep/{first}/kernel/README.md. Or, with umemc on the node:",
            f"`umemc build STACK -o DIR` and `sudo umemc apply DIR{_nodes_dir(plan, names)}` "
            "(it also installs a systemd unit that would run the stack outside Kubernetes: leave it disabled).",
            "",
        ]
    out["node-prep/README.md"] = "\n".join(lines)
    return out


def _nodes_dir(plan: Plan, names: list[str]) -> str:
    if not plan.nodes:
        return ""
    return f"/nodes/{names[0]}" if len(names) == 1 else "/nodes/NODE"
