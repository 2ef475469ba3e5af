"""Cluster specs: ``num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node`` CSVs,
short forms (``n8g8``), and heterogeneous clusters of several GPU generations
(``v100:3x4+p100:6x4+k80:16x8``: 3 nodes of 4 V100, 6 of 4 P100, 16 of 8 K80)."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["ClusterSpec", "load_cluster", "heterogeneous_cluster"]


@dataclass(frozen=True)
class ClusterSpec:
    """``switches x nodes_per_switch`` nodes of ``gpus_per_node`` GPUs; or, for a heterogeneous
    cluster, ``node_types``/``node_gpus`` give each node's GPU type and count (then
    ``gpus_per_node`` is the largest count; a node may offer 0 GPUs, as a live one down or drained
    does to a forecast, sim/forecast.py)."""

    switches: int
    nodes_per_switch: int
    gpus_per_node: int
    node_types: tuple = ()
    node_gpus: tuple = ()

    def __post_init__(self) -> None:
        if min(self.switches, self.nodes_per_switch, self.gpus_per_node) < 1:
            raise ConfigError(f"cluster spec {self}: every count must be >= 1")
        if self.node_types and (len(self.node_types) != self.nodes or len(self.node_gpus) != self.nodes
                                or min(self.node_gpus) < 0):
            raise ConfigError(f"cluster spec: need one GPU type and a count >= 0 for each of {self.nodes} nodes")

    @property
    def nodes(self) -> int:
        return self.switches * self.nodes_per_switch

    @property
    def capacities(self) -> tuple:
        """GPUs of each node."""
        return tuple(self.node_gpus) if self.node_gpus else (self.gpus_per_node,) * self.nodes

    @property
    def total_gpus(self) -> int:
        return sum(self.capacities)

    @property
    def gpus_by_type(self) -> dict:
        out: dict = {}
        for t, g in zip(self.node_types or ("gpu",) * self.nodes, self.capacities):
            out[t] = out.get(t, 0) + g
        return out


def heterogeneous_cluster(parts: dict) -> ClusterSpec:
    """``{"v100": (nodes, gpus_per_node), ...}`` as one switch of typed nodes, in the given order."""
    types, gpus = [], []
    for t, (n, g) in parts.items():
        if g < 1:
            raise ConfigError(f"GPU type {t}: its nodes need 1 GPU or more each, not {g}")
        types += [t] * n
        gpus += [g] * n
    if not types:
        raise ConfigError("a heterogeneous cluster needs at least one node")
    return ClusterSpec(1, len(types), max(gpus), tuple(types), tuple(gpus))


def load_cluster(spec: str) -> ClusterSpec:
    """A spec CSV path, a short form like ``n8g8`` (8 nodes x 8 GPUs, one switch), or a
    heterogeneous one like ``v100:3x4+k80:16x8`` (nodes x GPUs per node, per GPU type).

    Raises:
        ConfigError: the file is missing or malformed (the message names the column).
    """
    m = re.fullmatch(r"(?:s(\d+))?n(\d+)g(\d+)", spec)
    if m:
        return ClusterSpec(int(m.group(1) or 1), int(m.group(2)), int(m.group(3)))
    if re.fullmatch(r"[A-Za-z0-9_]+:\d+x\d+(\+[A-Za-z0-9_]+:\d+x\d+)*", spec):
        parts = {}
        for part in spec.split("+"):
            t, counts = part.split(":")
            if t in parts:
                raise ConfigError(f"cluster spec {spec}: GPU type {t} given twice")
            n, g = counts.split("x")
            parts[t] = (int(n), int(g))
        return heterogeneous_cluster(parts)
    from .traces import open_text

    try:
        with open_text(spec) as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise ConfigError(f"cluster spec {spec}: {exc.strerror}; give a CSV file or a form like n8g8 "
                          "or v100:3x4+k80:16x8") from None
    if len(rows) != 1:
        raise ConfigError(f"cluster spec {spec}: expected a header and one row, got {len(rows)} rows")
    try:
        r = rows[0]
        return ClusterSpec(int(r["num_switch"]), int(r["num_node_p_switch"]), int(r["num_gpu_p_node"]))
    except KeyError as exc:
        raise ConfigError(f"cluster spec {spec}: missing column {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"cluster spec {spec}: {exc}") from None
