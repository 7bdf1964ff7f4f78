"""`umemc lease-pod STACK --bytes SIZE --priority N [--node NODE] [--ttl 10m] [--holder NAME] [--name NAME]
[--gpu-device]`: a lease in a Kubernetes cluster. Under `umemc up` a lease is asked of the gateway (POST
/umemc/leases); in a cluster the scheduler is the ledger, so the lease is a pod that holds the memory there: this
prints it (its PriorityClass and a Pod of the pause image, memory request = limit = the lease, at its priority,
ended by the kubelet after its ttl) for `kubectl apply -f -`, and says on stderr where it can be placed and what it
would preempt (the one eviction policy on paper, as `umemc check` answers for a cold model). `kubectl delete pod
NAME -n NAMESPACE` releases it early."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..errors import UsageError
from ..units import parse_duration, parse_size
from .args import Args
from .common import plan_from_arg, print_warnings, write_stdout

N = TypeVar("N", int, float)

DEFAULT_TTL = "10m"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("lease-pod", help="print a lease for a Kubernetes cluster: a pod that holds the memory")
    p.add_argument("stack", help="the stack file the cluster runs (built with --target kubernetes)")
    p.add_argument("--bytes", required=True, help='the memory to hold, e.g. "20GiB"')
    p.add_argument("--priority", type=int, required=True, help="0-100: who it may preempt, who may preempt it")
    p.add_argument("--ttl", default=DEFAULT_TTL, help=f"how long it holds (default {DEFAULT_TTL})")
    p.add_argument("--node", help="the node of the stack it must be placed on")
    p.add_argument("--holder", default="lease", help="who holds it (a label of the pod, made a valid one)")
    p.add_argument("--name", help="the pod's name, a DNS label (default lease-HOLDER)")
    p.add_argument("--gpu-device", action="store_true", help="the pod also holds one of the node's GPU devices")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class LeasePodArgs(Args):
    stack: str
    bytes: str
    priority: int
    ttl: str
    node: str | None
    holder: str
    name: str | None
    gpu_device: bool


def run(ns: argparse.Namespace) -> int:
    args = LeasePodArgs.of(ns)
    from ..targets.kubernetes.lease_pods import LeaseAsk, lease_pod, lease_preemptions
    from ..targets.yamltext import dump_all

    holder = label_value(args.holder)
    if args.name is not None and not DNS_LABEL.fullmatch(args.name):
        raise UsageError(
            f"--name {args.name!r}: not a Pod name: lowercase letters, digits and '-', starting and ending with a "
            "letter or digit, at most 63 characters"
        )
    ask = LeaseAsk(
        name=args.name or f"lease-{holder}"[:63].rstrip("-"),
        holder=holder,
        holder_said=args.holder,
        bytes=_size(args.bytes),
        priority=_priority(args.priority),
        ttl_s=_ttl(args.ttl),
        node=args.node,
        gpu_device=args.gpu_device,
    )
    plan = plan_from_arg(args.stack)
    print_warnings(plan)
    docs = lease_pod(plan, ask)
    where = lease_preemptions(plan, ask)
    for node, victims in where.items():
        if victims is None:
            said = "cannot be placed (even preempting every lower-priority model)"
        elif victims:
            said = f"preempts {', '.join(victims)}"
        else:
            said = "fits beside the models placed there"
        print(f"{node}: {said}", file=sys.stderr)
    if all(v is None for v in where.values()):
        print(
            f"umemc lease-pod: no node can hold {args.bytes} at priority {ask.priority}: its pod would wait "
            "Pending for ever; not printed",
            file=sys.stderr,
        )
        return 1
    write_stdout(dump_all(docs))
    return 0


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def label_value(text: str) -> str:
    """A holder's name as a Kubernetes label value and a part of a Pod name (a DNS label): lower case, any other
    character '-', at most 57 characters (the Pod is lease-HOLDER); where more than a '_' changed (capitals, other
    characters, a cut), a short hash of the original keeps two holders apart. The holder's own spelling stays in
    the Pod's annotation."""
    import hashlib

    value = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "holder"
    if re.fullmatch(r"[a-z0-9_-]*", text) and len(value) <= 57:  # only '_' made '-', as umemc names are
        return value
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{value[:50].rstrip('-')}-{digest}"


def _positive(flag: str, text: str, parse: Callable[[str], N]) -> N:
    try:
        value = parse(text)
    except ValueError as exc:
        raise UsageError(f"{flag} {text}: {exc}") from None
    if value <= 0:
        raise UsageError(f"{flag} {text}: must be more than 0")
    return value


def _size(text: str) -> int:
    return _positive("--bytes", text, parse_size)


def _priority(value: int) -> int:
    if not 0 <= value <= 100:
        raise UsageError(f"--priority {value}: must be 0-100")
    return value


def _ttl(text: str) -> float:
    return _positive("--ttl", text, parse_duration)
