"""The etrun agent's side of Horovod (``--horovod``; docs/horovod.md): it serves the rendezvous
(:mod:`.horovod`), gives fresh workers horovodrun's environment, and drives elastic Horovod. When
a worker dies, the survivors go on alone in a smaller generation. They are then told that
workers are coming, and once all of them are waiting at a commit, the job asks for a full-size
(``scale_up``) generation that the replacements join."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Callable, Optional

from ..errors import ConfigError
from ..runtime.control import mark_inprocess
from .horovod import HorovodRendezvous, Slot, horovod_env

__all__ = ["HorovodDriver"]

log = logging.getLogger("etrun")

#: seconds between two notifications of the survivors that workers are coming (until they stop at a commit)
RENOTIFY = 1.0


class HorovodDriver:
    """One per agent. ``host``: the address the rendezvous listens on and the workers call;
    ``loopback``: it is a loopback address (gloo is then bound to the loopback interface);
    ``control_root``: the agent's per-slot control directories."""

    def __init__(self, host: str, loopback: bool, control_root: str, wait: float, name: str = "",
                 listen: Optional[str] = None, required: bool = True) -> None:
        """``name``: the worker's ``HOROVOD_HOSTNAME`` (default: this host's name; a job that may span
        several nodes gives each agent its own, as two may share a host); ``listen``: the address
        the rendezvous listens on, where it differs from ``host`` (all interfaces: ``""``);
        ``required`` (``--horovod on``): on several nodes, node rank 0 without a rendezvous is an
        error (else, ``auto``, the generation runs without Horovod's environment)."""
        self.host, self._control, self.required = host, control_root, required
        self.rdzv = HorovodRendezvous(host if listen is None else listen, name or socket.gethostname(), wait=wait,
                                      on_register=self._registered)
        self.multi = False  # the current generation spans several nodes
        self._iface = None if "HOROVOD_GLOO_IFACE" in os.environ or not loopback else _loopback_iface()
        self.group = None  # the agent's running WorkerGroup
        self.slots: Optional[list[int]] = None  # the next generation's slots, if not all
        self.shrunk = False  # the job runs on its survivors: bring it back to full size
        self.grow = False  # the next join asks for a full-size generation (scale_up)
        self._told = (0, 0.0)  # the generation whose survivors were last told that workers are coming, and when
        self._notifier: Optional[threading.Thread] = None  # the telling in flight (one at a time)
        log.info("serving Horovod's gloo rendezvous on %s:%d", host, self.rdzv.port)

    def close(self) -> None:
        self.rdzv.close()

    def take(self) -> tuple[Optional[list[int]], bool]:
        """For the next join: the slots it offers (None: all) and whether it asks to grow."""
        slots, grow, self.slots, self.grow = self.slots, self.grow, None, False
        return slots, grow

    def open(self, a, slots: list[int]) -> Callable[[int], dict]:
        """Open the rendezvous for generation ``a`` (``slots``: its local workers in rank order);
        returns each fresh worker's Horovod variables."""
        n = len(slots)
        places = {lr: Slot(a.rank_offset + i, a.world_size, i, n, a.node_rank, a.nnodes) for i, lr in enumerate(slots)}
        self.rdzv.remote_hosts = _addresses([a.master_addr] + [w.rpartition(":")[0] for w in a.workers])
        self.multi = a.nnodes > 1
        leader = None
        if self.multi and a.node_rank != 0:
            if not a.horovod_port:
                if self.required:
                    raise ConfigError("Horovod on several nodes: node rank 0 serves no Horovod rendezvous; install "
                                      "Horovod there and run its etrun with --horovod on or auto")
                log.warning("generation %d: node rank 0 serves no Horovod rendezvous (Horovod not installed there, "
                            "or --horovod off): this node's workers run without Horovod's environment", a.generation)
                self.multi = False
                self.rdzv.begin(a.generation, places)  # (its own, which nobody calls: started() reads its slots)
                return lambda lr: {}
            leader = (a.master_addr, a.horovod_port)
        self.rdzv.begin(a.generation, places, multi=self.multi, leader=leader)
        rdzv, host, iface = self.rdzv, self.host, self._iface
        return lambda lr: horovod_env(places[lr], rdzv.hostname, host, rdzv.port, elastic=True, iface=iface)

    def started(self, a, group, shrunk: bool) -> None:
        self.rdzv.started(a.generation, set(group.slots) - set(group.carried))
        self.shrunk = shrunk  # on the survivors only: grow back once they can be told

    def after_failure(self, group) -> None:
        """The survivors were kept: if they all run ``hvd.elastic.run``, they go on by themselves
        in the next generation, and the dead are replaced in one after it."""
        alive = [w.local_rank for w in group.workers if w.proc.poll() is None]
        if not self.multi and not self.shrunk and self.rdzv.elastic(alive):
            self.slots = alive

    def should_grow(self, group, a, full: int) -> bool:
        """While the job runs on its survivors: tell them workers are coming, again every
        ``RENOTIFY`` seconds until they act on it; True when every one of them has stopped at a
        commit to ask for its place (carry them and join). (Told once, a survivor still resetting
        into this generation loses the message: Horovod's ``State.on_reset`` drops the updates
        that came during the reset, and a loaded host makes that window seconds long.)"""
        alive = [w.local_rank for w in group.workers if w.proc.poll() is None]
        if self.rdzv.waiting < len(alive):
            gen, at = self._told
            now = time.monotonic()
            busy = self._notifier is not None and self._notifier.is_alive()  # (a survivor slow to answer)
            if not busy and (gen != a.generation or now - at >= RENOTIFY):
                self._told = (a.generation, now)
                self._notifier = threading.Thread(target=self.rdzv.notify_added, args=(alive,),
                                                  name="et-horovod-notify", daemon=True)
                self._notifier.start()
            return False
        log.info("generation %d: the survivors stopped at a commit; growing back to %d local workers", a.generation,
                 full)
        self.shrunk, self.grow = False, True
        return True

    def _registered(self, slot: int) -> None:
        """A worker registered for Horovod's elastic notifications: it recovers in process
        (``hvd.elastic.run``), so mark it as opted in, as ``elastictrain_torch.elastic.run`` does.
        Not on several nodes: there every node's workers restart (launcher/horovod.py)."""
        group = self.group
        if self.multi:
            return
        for w in group.workers if group is not None else ():
            if w.local_rank == slot:
                mark_inprocess(os.path.join(self._control, str(slot)), w.proc.pid)


def _loopback_iface() -> Optional[str]:
    """The loopback interface's name (gloo binds to an interface by name), where it can be found."""
    try:
        for name in os.listdir("/sys/class/net"):
            with open(f"/sys/class/net/{name}/type") as f:
                if f.read().strip() == "772":  # ARPHRD_LOOPBACK
                    return name
    except OSError:
        pass
    return None


def _addresses(hosts: list[str]) -> set[str]:
    """The IP addresses of the generation's hosts (the peers the rendezvous serves from afar)."""
    out: set[str] = set()
    for h in set(hosts):
        if not h:
            continue
        try:
            out.update(info[4][0] for info in socket.getaddrinfo(h.strip("[]"), None))
        except OSError:
            log.warning("cannot resolve %s: its workers cannot reach the Horovod rendezvous", h)
    return out
