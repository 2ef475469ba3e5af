"""Coordinator throughput: shard operations per second and their latency, against health requests.

Starts a real coordinator process (SQLite WAL file in a temp dir) and drives it from this
process with N concurrent keep-alive HTTP/1.1 connections on loopback (asyncio + uvloop, a
hand-rolled minimal client so that the load generator is not the bottleneck). Each virtual
client is one worker of an N-worker generation and loops: lease a shard, report progress
three times, and every fourth shard send its part of a checkpoint commit (a commit completes
when all N parts are in). The baseline is the same server answering ``GET /v1/health``
under the same load generator: the ratio shows the cost of our logic and the durable write.

The same run then repeats on PostgreSQL (``--db postgresql://...``, a private server started
here with Debian's binaries, fsync on; the coordinator commits in groups there) and prints the
``pg_*`` figures and ``pg_vs_sqlite_*`` ratios, where PostgreSQL is installed (``--stores sqlite``
skips it).

Prints ``name: value unit`` lines. ``--quick`` runs shorter windows.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

import msgspec

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastictrain import CoordinatorClient, DatasetSpec  # noqa: E402
from elastictrain.coordinator.process import CoordinatorProcess  # noqa: E402
from elastictrain.wire import (  # noqa: E402
    CommitRequest, LeaseReply, LeaseRequest, ProgressRequest, ShardUpdate,
)

ENC = msgspec.msgpack.Encoder()
LEASE_DEC = msgspec.msgpack.Decoder(LeaseReply)


class Conn:
    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.auth = f"Authorization: Bearer {token}\r\n".encode()

    async def open(self) -> None:
        self.r, self.w = await asyncio.open_connection(self.host, self.port)

    async def call(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        head = (f"{method} {path} HTTP/1.1\r\nHost: b\r\nContent-Type: application/msgpack\r\n"
                f"Content-Length: {len(body)}\r\n").encode()
        self.w.write(head + self.auth + b"\r\n" + body)
        raw = await self.r.readuntil(b"\r\n\r\n")
        status = int(raw[9:12])
        n = 0
        for line in raw.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                n = int(line[15:])
        return status, await self.r.readexactly(n)

    def close(self) -> None:
        self.w.close()


async def health_client(conn: Conn, stop: float, lat: list[float]) -> None:
    while time.perf_counter() < stop:
        t = time.perf_counter()
        status, _ = await conn.call("GET", "/v1/health")
        lat.append(time.perf_counter() - t)
        assert status == 200


async def shard_client(conn: Conn, job: str, gen: int, rank: int, world: int, stop: float,
                       lat: list[float], state: dict, window: int = 0) -> None:
    base = f"/v1/jobs/{job}/datasets/d/"
    n_shards = 0
    touched: dict[int, tuple[int, int]] = {}

    async def op(verb: str, msg) -> bytes:
        t = time.perf_counter()
        status, body = await conn.call("POST", base + verb, ENC.encode(msg))
        lat.append(time.perf_counter() - t)
        if status != 200:
            raise RuntimeError(f"{verb} answered {status}: {msgspec.msgpack.decode(body)}")
        return body

    while time.perf_counter() < stop:
        reply = LEASE_DEC.decode(await op("lease", LeaseRequest(gen, rank, f"{rank}-{n_shards}")))
        ls = reply.lease
        step = max(1, (ls.end - ls.start) // 3)
        for off in (ls.start + step, ls.start + 2 * step, ls.end):
            await op("progress", ProgressRequest(gen, rank, [ShardUpdate(ls.shard_id, ls.lease_id, off)]))
            touched[ls.shard_id] = (ls.lease_id, off)
        n_shards += 1
        if n_shards % 4 == 0:
            k = n_shards // 4
            ups = [ShardUpdate(s, lid, off) for s, (lid, off) in sorted(touched.items())]
            # each window's checkpoints are new ones (a checkpoint's parts may not change once complete)
            step = window * 10_000_000 + k
            await op("commit", CommitRequest(gen, rank, world, f"w{window}-ck{k}", step, ups))
            touched.clear()
            state["commits"] = max(state.get("commits", 0), k)


async def drive(kind: str, url: str, token: str, clients: int, seconds: float, job: str = "",
                gen: int = 0) -> tuple[float, list[float]]:
    import uvloop  # noqa: F401  (installed with elastictrain)

    host, port = url.split("//")[1].rsplit(":", 1)
    conns = [Conn(host, int(port), token) for _ in range(clients)]
    await asyncio.gather(*(c.open() for c in conns))
    lat: list[float] = []
    state: dict = {}
    # warm-up, then a measured window
    for w, (window, keep) in enumerate(((min(1.0, seconds / 3), False), (seconds, True))):
        lat.clear()
        stop = time.perf_counter() + window
        t0 = time.perf_counter()
        if kind == "health":
            await asyncio.gather(*(health_client(c, stop, lat) for c in conns))
        else:
            await asyncio.gather(*(shard_client(c, job, gen, i, clients, stop, lat, state, w)
                                   for i, c in enumerate(conns)))
        elapsed = time.perf_counter() - t0
    for c in conns:
        c.close()
    return len(lat) / elapsed, sorted(lat)


def pct(sorted_lat: list[float], p: float) -> float:
    return sorted_lat[min(len(sorted_lat) - 1, int(p / 100 * len(sorted_lat)))] * 1000


def run_store(store: str, url: str, token: str, counts: list[int], seconds: float) -> dict:
    """Every figure of one coordinator, printed with ``prefix``; returns them by name."""
    import uvloop

    prefix = "" if store == "sqlite" else "pg_"
    client = CoordinatorClient(url, token, retry_for=30.0)
    out = {}
    for n in counts:
        h_rps, h_lat = uvloop.run(drive("health", url, token, n, seconds))
        job = f"bench{n}"
        client.create_job(job, 1, n)
        gen = client.open_generation(job, 0, n).generation
        client.register_dataset(job, DatasetSpec("d", 10**12, 1000, epochs=1))
        s_rps, s_lat = uvloop.run(drive("shard", url, token, n, seconds, job, gen))
        commits = len(client.commits(job, "d").commits)
        figures = [(f"health_c{n}_rps", h_rps, "req/s", "{:.0f}"), (f"health_c{n}_p50", pct(h_lat, 50), "ms", "{:.2f}"),
                   (f"health_c{n}_p99", pct(h_lat, 99), "ms", "{:.2f}"), (f"shard_ops_c{n}_rps", s_rps, "ops/s", "{:.0f}"),
                   (f"shard_ops_c{n}_p50", pct(s_lat, 50), "ms", "{:.2f}"),
                   (f"shard_ops_c{n}_p99", pct(s_lat, 99), "ms", "{:.2f}"),
                   (f"shard_ops_c{n}_mean", statistics.fmean(s_lat) * 1000, "ms", "{:.2f}"),
                   (f"shard_ops_c{n}_vs_health", s_rps / h_rps, "ratio", "{:.2f}"),
                   (f"shard_ops_c{n}_complete_commits", commits, "commits", "{}")]
        for name, value, unit, fmt in figures:
            print(f"{prefix}{name}: {fmt.format(value)} {unit}")
            out[name] = value
        sys.stdout.flush()
    client.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short windows (about 30 s in all)")
    ap.add_argument("--clients", default="16,64,256")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--stores", default="sqlite,postgresql", help="sqlite, postgresql, or both (the default)")
    args = ap.parse_args()
    seconds = args.seconds or (2.0 if args.quick else 6.0)
    counts = [int(x) for x in args.clients.split(",")]
    stores = [x.strip() for x in args.stores.split(",")]

    tmp = tempfile.mkdtemp(prefix="et-bench-")
    results = {}
    if "sqlite" in stores:
        proc = CoordinatorProcess(os.path.join(tmp, "c.db"), os.path.join(tmp, "token"),
                                  log_file=os.path.join(tmp, "coordinator.log"))
        url = proc.start()
        print(f"# coordinator {url}, db {tmp}/c.db (SQLite WAL, synchronous=NORMAL); load generator: "
              f"1 process, asyncio+uvloop; {os.cpu_count()} CPUs shared by both; window {seconds:.0f} s")
        try:
            results["sqlite"] = run_store("sqlite", url, proc.token, counts, seconds)
        finally:
            proc.stop()
    if "postgresql" in stores:
        from elastictrain.coordinator.pg_local import LocalPostgres, find_postgres

        if find_postgres() is None:
            print("# PostgreSQL is not installed (apt-get install postgresql): no pg_* figures")
        else:
            with LocalPostgres() as pg:
                db = pg.create_database("bench")
                proc = CoordinatorProcess(db, os.path.join(tmp, "token"), log_file=os.path.join(tmp, "coord-pg.log"))
                url = proc.start()
                with CoordinatorClient(url, proc.token, retry_for=30.0) as c:
                    c.jobs()  # it leads (a lone coordinator takes the lease at once)
                print(f"# coordinator {url}, db PostgreSQL {pg.bin.split('/')[-2]} on this machine (fsync and "
                      "synchronous_commit on: a reply waits for the commit on disk; group commit); same load "
                      "generator and window")
                try:
                    results["postgresql"] = run_store("postgresql", url, proc.token, counts, seconds)
                finally:
                    proc.stop()
    if len(results) == 2:
        for n in counts:
            sq, pg_ = results["sqlite"], results["postgresql"]
            print(f"pg_vs_sqlite_shard_ops_c{n}_rps: {pg_[f'shard_ops_c{n}_rps'] / sq[f'shard_ops_c{n}_rps']:.2f} "
                  "ratio")
            print(f"pg_vs_sqlite_shard_ops_c{n}_p99: {pg_[f'shard_ops_c{n}_p99'] / sq[f'shard_ops_c{n}_p99']:.2f} "
                  "ratio")


if __name__ == "__main__":
    main()
