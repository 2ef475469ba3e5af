"""Cluster specs: ``num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node`` CSVs."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["ClusterSpec", "load_cluster"]


@dataclass(frozen=True)
class ClusterSpec:
    switches: int
    nodes_per_switch: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if min(self.switches, self.nodes_per_switch, self.gpus_per_node) < 1:
            raise ConfigError(f"cluster spec {self}: every count must be >= 1")

    @property
    def nodes(self) -> int:
        return self.switches * self.nodes_per_switch

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def load_cluster(spec: str) -> ClusterSpec:
    """A spec CSV path, or a short form like ``n8g8`` (8 nodes x 8 GPUs, one switch).

    Raises:
        ConfigError: the file is missing or malformed (the message names the column).
    """
    m = re.fullmatch(r"(?:s(\d+))?n(\d+)g(\d+)", spec)
    if m:
        return ClusterSpec(int(m.group(1) or 1), int(m.group(2)), int(m.group(3)))
    try:
        with open(spec, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise ConfigError(f"cluster spec {spec}: {exc.strerror}; give a CSV file or a form like n8g8") from None
    if len(rows) != 1:
        raise ConfigError(f"cluster spec {spec}: expected a header and one row, got {len(rows)} rows")
    try:
        r = rows[0]
        return ClusterSpec(int(r["num_switch"]), int(r["num_node_p_switch"]), int(r["num_gpu_p_node"]))
    except KeyError as exc:
        raise ConfigError(f"cluster spec {spec}: missing column {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"cluster spec {spec}: {exc}") from None
