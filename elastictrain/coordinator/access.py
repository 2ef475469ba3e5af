"""Who may do what: the coordinator's identities, its one allow/deny table, and its credentials.

Four kinds of credential, each a bearer token:

* **admin**: the token file's token (``--token-file``, created at first start). Does everything,
  and may act for a user (``submit --user``), which the event log records.
* **user**: ``elastictrain users add alice`` (an admin's command) prints one once. Submits, lists,
  cancels and reads the logs of its own jobs; sees the cluster's shape and the queue, without other
  users' commands, working directories, environment or logs; runs its jobs as its UNIX account.
* **node**: ``elastictrain nodes add n1``: a node daemon (or an engine adapter) may register, poll
  and report the tasks placed on node ``n1``, nothing else.
* **worker**: minted by the coordinator for one run of one job (a group task: its member jobs) and
  handed to that run alone (through its node daemon, or its engine's run directory). It may use
  its own jobs' routes (rendezvous, shards, commits, resources, profiles, steps) while the run
  lives; a later run, or another job, refuses it.

Tokens are stored as SHA-256 digests (the database never holds one), looked up by digest; the
admin token is compared with :func:`hmac.compare_digest`. A digest lookup leaks nothing useful
through timing: finding a token from its digest's first bytes is a preimage search.

:data:`ACCESS` is the one table of what each may do, by route. ``docs/security.md`` shows it (a
test keeps the two the same), and :meth:`Access.check` is the only place it is read.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from ..errors import ConfigError, ForbiddenError, NotFoundError
from ..model import check_name

__all__ = ["Identity", "ACCESS", "ROLES", "Access", "Credentials", "ADMIN", "check_job_env", "check_job_command",
           "DEFAULT_ENV_ALLOW", "access_table_markdown"]

ROLES = ("admin", "user", "node", "worker")

# what a role may do on a route:
#   allow: yes; deny: no (403);
#   own: only its own jobs (a user: jobs it submitted or created; a worker: its run's jobs while
#        the run lives) or its own node (a node credential: the node it was made for);
#   view: yes, but other users' commands, working directories, environment and logs are left out
ALLOW, DENY, OWN, VIEW = "allow", "deny", "own", "view"

_JOB_ROUTE = {"admin": ALLOW, "user": OWN, "node": DENY, "worker": OWN}
_ADMIN_ONLY = {"admin": ALLOW, "user": DENY, "node": DENY, "worker": DENY}
_NODE_ROUTE = {"admin": ALLOW, "user": DENY, "node": OWN, "worker": DENY}
_PUBLIC = {r: ALLOW for r in ROLES}

#: route -> role -> rule. Routes are written as in docs/coordinator.md.
ACCESS: dict[str, dict[str, str]] = {
    "GET /v1/health": _PUBLIC,
    "GET /v1/version": _PUBLIC,
    "GET /v1/whoami": _PUBLIC,
    # etrun jobs: membership, rendezvous, shards and commits
    "POST /v1/jobs": {"admin": ALLOW, "user": OWN, "node": DENY, "worker": OWN},
    "GET /v1/jobs": {"admin": ALLOW, "user": VIEW, "node": DENY, "worker": VIEW},
    "GET /v1/jobs/{job}": _JOB_ROUTE,
    "POST /v1/jobs/{job}/generations": _JOB_ROUTE,
    "POST /v1/jobs/{job}/datasets": _JOB_ROUTE,
    "GET /v1/jobs/{job}/datasets/{ds}": _JOB_ROUTE,
    "POST /v1/jobs/{job}/datasets/{ds}/lease": _JOB_ROUTE,
    "POST /v1/jobs/{job}/datasets/{ds}/progress": _JOB_ROUTE,
    "POST /v1/jobs/{job}/datasets/{ds}/commit": _JOB_ROUTE,
    "POST /v1/jobs/{job}/datasets/{ds}/restore": _JOB_ROUTE,
    "POST /v1/jobs/{job}/datasets/{ds}/release": _JOB_ROUTE,
    "GET /v1/jobs/{job}/datasets/{ds}/commits": _JOB_ROUTE,
    "POST /v1/jobs/{job}/resources": _JOB_ROUTE,
    "GET /v1/jobs/{job}/resources": _JOB_ROUTE,
    "POST /v1/jobs/{job}/profiles": _JOB_ROUTE,
    "GET /v1/jobs/{job}/profiles": _JOB_ROUTE,
    "POST /v1/jobs/{job}/steps": _JOB_ROUTE,
    "POST /v1/jobs/{job}/agents/join": _JOB_ROUTE,
    "POST /v1/jobs/{job}/agents/poll": _JOB_ROUTE,
    "POST /v1/jobs/{job}/agents/report": _JOB_ROUTE,
    # the scheduler
    "GET /v1/cluster": {"admin": ALLOW, "user": VIEW, "node": DENY, "worker": DENY},
    "GET /v1/cluster/jobs": {"admin": ALLOW, "user": VIEW, "node": DENY, "worker": DENY},
    "POST /v1/cluster/jobs": {"admin": ALLOW, "user": OWN, "node": DENY, "worker": DENY},
    "POST /v1/cluster/arrays": {"admin": ALLOW, "user": OWN, "node": DENY, "worker": DENY},
    "GET /v1/cluster/jobs/{job}": {"admin": ALLOW, "user": VIEW, "node": DENY, "worker": OWN},
    "POST /v1/cluster/jobs/{job}/cancel": {"admin": ALLOW, "user": OWN, "node": DENY, "worker": DENY},
    "POST /v1/cluster/jobs/{job}/hold": {"admin": ALLOW, "user": OWN, "node": DENY, "worker": DENY},
    "POST /v1/cluster/jobs/{job}/release": {"admin": ALLOW, "user": OWN, "node": DENY, "worker": DENY},
    "POST /v1/cluster/jobs/{job}/update": {"admin": ALLOW, "user": OWN, "node": DENY, "worker": DENY},
    "POST /v1/cluster/jobs/{job}/requeue": {"admin": ALLOW, "user": OWN, "node": DENY, "worker": DENY},
    "POST /v1/cluster/jobs/{job}/result": {"admin": ALLOW, "user": DENY, "node": DENY, "worker": OWN},
    "GET /v1/cluster/jobs/{job}/logs": {"admin": ALLOW, "user": OWN, "node": DENY, "worker": DENY},
    "GET /v1/cluster/jobs/{job}/steps": {"admin": ALLOW, "user": OWN, "node": DENY, "worker": DENY},
    "GET /v1/cluster/events": {"admin": ALLOW, "user": VIEW, "node": DENY, "worker": DENY},
    "GET /v1/cluster/forecast": {"admin": ALLOW, "user": VIEW, "node": DENY, "worker": DENY},
    "GET /v1/cluster/usage": {"admin": ALLOW, "user": VIEW, "node": DENY, "worker": DENY},
    "GET /v1/cluster/utilization": {"admin": ALLOW, "user": ALLOW, "node": DENY, "worker": DENY},
    "GET /metrics": {"admin": ALLOW, "user": ALLOW, "node": DENY, "worker": DENY},
    "GET /v1/cluster/users": {"admin": ALLOW, "user": ALLOW, "node": DENY, "worker": DENY},
    "POST /v1/cluster/users/{user}": _ADMIN_ONLY,
    "POST /v1/cluster/users/{user}/quota": _ADMIN_ONLY,
    "GET /v1/cluster/projects": {"admin": ALLOW, "user": ALLOW, "node": DENY, "worker": DENY},
    "POST /v1/cluster/projects/{project}": _ADMIN_ONLY,
    "POST /v1/cluster/nodes/{node}/register": _NODE_ROUTE,
    "POST /v1/cluster/nodes/{node}/poll": _NODE_ROUTE,
    "POST /v1/cluster/nodes/{node}/leave": _NODE_ROUTE,
    "POST /v1/cluster/nodes/{node}/cordon": _ADMIN_ONLY,
    # credentials
    "GET /v1/admin/accounts": _ADMIN_ONLY,
    "POST /v1/admin/users/{user}": _ADMIN_ONLY,
    "POST /v1/admin/users/{user}/revoke": _ADMIN_ONLY,
    "POST /v1/admin/nodes/{node}": _ADMIN_ONLY,
    "POST /v1/admin/nodes/{node}/revoke": _ADMIN_ONLY,
}

PUBLIC_ROUTES = frozenset(k for k, v in ACCESS.items() if v is _PUBLIC)


@dataclass(frozen=True)
class Identity:
    """Who sent a request. ``name``: the user (role user), the node (role node), ``admin``, or for
    a worker its task's job id; ``jobs``/``run``: a worker's jobs and run."""

    role: str
    name: str
    run: int = 0
    jobs: frozenset = field(default_factory=frozenset)
    anonymous: bool = False

    def __str__(self) -> str:
        return f"{self.role} {self.name}" if self.role != "worker" else f"worker of job {self.name} run {self.run}"


ADMIN = Identity("admin", "admin")
ANONYMOUS = Identity("anonymous", "", anonymous=True)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


_CRED, _ACCOUNT, _OWNER = "cred:", "account:", "owner:"
RESERVED_USERS = ("admin", "default")  # the admin credential's name; the user of a job nobody named


@dataclass
class Account:
    """A user's UNIX account on the nodes, and whether an admin let its jobs run as root."""

    user: str
    unix_user: str
    allow_root: bool = False
    created: float = 0.0


class Credentials:
    """Users' accounts and every credential but the admin's, kept (as digests) in the store's
    key/value table; the admin token is held in memory only (it lives in the token file)."""

    def __init__(self, store, meta: dict[str, str]) -> None:
        self.store = store
        self._admin = b""
        self._by_digest: dict[str, dict] = {}
        self.accounts: dict[str, Account] = {}
        self.worker_tokens: dict[tuple, str] = {}  # (job, run) -> plaintext, minted by this process
        self.owners: dict[str, str] = {}  # etrun job -> the user whose credential first used its name
        for k, v in meta.items():
            try:
                if k.startswith(_OWNER):
                    self.owners[k[len(_OWNER):]] = v
                elif k.startswith(_CRED):
                    self._by_digest[k[len(_CRED):]] = json.loads(v)
                elif k.startswith(_ACCOUNT):
                    a = json.loads(v)
                    self.accounts[k[len(_ACCOUNT):]] = Account(k[len(_ACCOUNT):], a["unix_user"],
                                                               bool(a.get("allow_root")), float(a.get("created", 0)))
            except (ValueError, KeyError, TypeError):
                continue  # a damaged row grants nothing

    def set_admin(self, token: str) -> None:
        if not token:
            raise ValueError("the coordinator needs a non-empty admin token")
        self._admin = token.encode()

    # ------------------------------------------------------------------ lookup
    def identify(self, token: bytes) -> Optional[Identity]:
        """The identity a presented token stands for, or None."""
        if hmac.compare_digest(token, self._admin):
            return ADMIN
        try:
            text = token.decode("ascii")
        except UnicodeDecodeError:
            return None
        rec = self._by_digest.get(digest(text))
        if rec is None:
            return None
        role = rec.get("role")
        if role == "worker":
            return Identity("worker", rec["job"], int(rec["run"]), frozenset(rec.get("jobs") or [rec["job"]]))
        if role in ("user", "node"):
            return Identity(role, rec["name"])
        return None

    # ------------------------------------------------------------------ changes (admin)
    def _write(self, puts: dict[str, str], deletes: Iterable[str] = ()) -> None:
        with self.store.transaction() as tx:
            for k in deletes:
                tx.delete_meta(k)
            for k, v in puts.items():
                tx.put_meta(k, v)

    def _drop(self, role: str, name: str) -> list[str]:
        return [_CRED + d for d, r in self._by_digest.items() if r.get("role") == role and r.get("name") == name]

    def add_user(self, user: str, unix_user: str, allow_root: bool) -> str:
        """A new token for ``user`` (any earlier one is revoked); its jobs run as ``unix_user``."""
        check_name("user", user)
        if user in RESERVED_USERS:
            raise ConfigError(f"{user!r} is reserved ('admin' names the admin credential, 'default' the user of jobs "
                              "submitted without one); choose another user name")
        _check_unix_name(unix_user)
        token = "etu_" + secrets.token_urlsafe(32)
        acct = Account(user, unix_user, allow_root, time.time())
        drop = self._drop("user", user)
        self._write({_ACCOUNT + user: json.dumps({"unix_user": unix_user, "allow_root": allow_root,
                                                  "created": acct.created}),
                     _CRED + digest(token): json.dumps({"role": "user", "name": user, "created": acct.created})}, drop)
        for k in drop:
            self._by_digest.pop(k[len(_CRED):], None)
        self._by_digest[digest(token)] = {"role": "user", "name": user}
        self.accounts[user] = acct
        return token

    def add_node(self, node: str) -> str:
        """A new token for node daemon ``node`` (any earlier one is revoked)."""
        check_name("node", node)
        token = "etn_" + secrets.token_urlsafe(32)
        drop = self._drop("node", node)
        self._write({_CRED + digest(token): json.dumps({"role": "node", "name": node, "created": time.time()})}, drop)
        for k in drop:
            self._by_digest.pop(k[len(_CRED):], None)
        self._by_digest[digest(token)] = {"role": "node", "name": node}
        return token

    def revoke(self, role: str, name: str) -> int:
        """Revoke ``name``'s credentials (a user's account goes too); how many there were.

        Raises:
            NotFoundError: there is none.
        """
        drop = self._drop(role, name)
        had_account = role == "user" and name in self.accounts
        if not drop and not had_account:
            raise NotFoundError(f"no {role} {name!r} has a credential; `elastictrain users accounts` lists them")
        self._write({}, [*drop, *((_ACCOUNT + name,) if had_account else ())])
        for k in drop:
            self._by_digest.pop(k[len(_CRED):], None)
        self.accounts.pop(name, None) if role == "user" else None
        return len(drop)

    def claim(self, job: str, user: str) -> None:
        """``user`` owns etrun job ``job`` from now on (its credential used the name first)."""
        self._write({_OWNER + job: user})
        self.owners[job] = user

    def nodes(self) -> list[str]:
        return sorted({r["name"] for r in self._by_digest.values() if r.get("role") == "node"})

    # ------------------------------------------------------------------ workers
    def worker_token(self, job: str, run: int, jobs: list[str]) -> str:
        """The token of run ``run`` of ``job`` (minted at first ask; a restarted coordinator, which
        never stored the token itself, mints another for the same run)."""
        key = (job, run)
        token = self.worker_tokens.get(key)
        if token is None:
            token = "etw_" + secrets.token_urlsafe(32)
            rec = {"role": "worker", "job": job, "run": run, "jobs": sorted(set(jobs) | {job}), "created": time.time()}
            self._write({_CRED + digest(token): json.dumps(rec)})
            self._by_digest[digest(token)] = rec
            self.worker_tokens[key] = token
        return token

    def prune_workers(self, alive: Callable[[str, int], bool]) -> int:
        """Delete the worker credentials of runs that ended; how many."""
        dead = [d for d, r in self._by_digest.items() if r.get("role") == "worker" and not alive(r["job"], r["run"])]
        if dead:
            self._write({}, [_CRED + d for d in dead])
            for d in dead:
                rec = self._by_digest.pop(d)
                self.worker_tokens.pop((rec["job"], rec["run"]), None)
        return len(dead)


class Access:
    """Applies :data:`ACCESS`. ``owner(job)``: the user a job belongs to ("": the admin's, None: no
    such job; ``claim(job, user)`` makes a user the owner of a new one);
    ``run_alive(job, run)``: whether a run still has a task that holds its GPUs or is exiting."""

    def __init__(self, owner: Callable[[str], Optional[str]], run_alive: Callable[[str, int], bool],
                 claim: Callable[[str, str], None]) -> None:
        self.owner, self.run_alive, self.claim = owner, run_alive, claim

    def check(self, who: Identity, route: str, args: tuple) -> str:
        """The rule that lets ``who`` use ``route`` with path arguments ``args``.

        Raises:
            ForbiddenError: it may not, with the reason.
        """
        rule = ACCESS[route].get(who.role, DENY)
        if rule == DENY:
            raise ForbiddenError(f"{who} may not use {route}; {_WHO_MAY[route]}")
        if rule != OWN or not args:
            return rule
        first = args[0]
        if who.role == "node":
            if first != who.name:
                raise ForbiddenError(f"this credential is node {who.name}'s; it cannot act for node {first}")
            return rule
        if who.role == "worker":
            if first not in who.jobs:
                raise ForbiddenError(f"this worker credential belongs to job {who.name} (run {who.run}); it cannot "
                                     f"use job {first}'s routes")
            if not self.run_alive(who.name, who.run):
                raise ForbiddenError(f"this worker credential belonged to run {who.run} of job {who.name}, which has "
                                     "ended; each run gets its own")
            return rule
        owner = self.owner(first)
        if owner is None and route.startswith("POST "):  # a new etrun job: the first user to name it owns it
            self.claim(first, who.name)
            return rule
        if owner != who.name:
            raise ForbiddenError(f"job {first} is not {who.name}'s; a user may only touch its own jobs")
        return rule

    def may_see(self, who: Identity, job_owner: str, job: str = "") -> bool:
        """Whether ``who`` sees a job's command, working directory, environment and logs."""
        if who.role == "admin":
            return True
        if who.role == "user":
            return job_owner == who.name
        if who.role == "worker":
            return job in who.jobs
        return False


def _who_may(route: str) -> str:
    rules = ACCESS[route]
    out = []
    for role in ROLES:
        r = rules.get(role, DENY)
        if r == ALLOW or r == VIEW:
            out.append(f"{role}s" if role != "admin" else "the admin")
        elif r == OWN:
            out.append({"user": "a user for its own jobs", "worker": "a worker for its own run's jobs",
                        "node": "a node credential for its own node"}.get(role, role))
    return ("only " + ", ".join(out) + " may") if out else "no credential may"


_WHO_MAY = {route: _who_may(route) for route in ACCESS}


def access_table_markdown() -> str:
    """:data:`ACCESS` as the Markdown table in docs/security.md."""
    lines = ["| route | admin | user | node | worker |", "|---|---|---|---|---|"]
    for route, rules in ACCESS.items():
        lines.append(f"| `{route}` | " + " | ".join(rules.get(r, DENY) for r in ROLES) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- what a job may carry
#: environment variables a submitted job may set (shell patterns); an admin adds more with
#: ``coordinator --job-env-allow``. A name in :data:`ENV_NEVER` is refused whatever the list says.
DEFAULT_ENV_ALLOW = (
    "OMP_*", "MKL_*", "KMP_*", "OPENBLAS_*", "NUMEXPR_*", "NCCL_*", "GLOO_*", "UCX_*", "TORCH_*", "PYTORCH_*",
    "CUBLAS_*", "CUDNN_*", "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS", "NVIDIA_TF32_OVERRIDE", "TF_*",
    "XLA_*", "JAX_*", "HF_*", "TRANSFORMERS_*", "TOKENIZERS_*", "WANDB_*", "MLFLOW_*", "TENSORBOARD_*",
    "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE", "LANG", "LC_*", "TZ",
    "JOB_*", "APP_*", "TORCHX_*", "ET_LOG_LEVEL", "ET_MONITOR_PERIOD", "ET_MONITOR_BATCH", "ET_HANG_TIMEOUT",
    "ET_STEP_REPORT_INTERVAL", "ET_PROFILE_ITERATIONS", "ET_PROFILE_WARMUP", "ET_PROFILE_OUT", "ET_STAGE_CUDA",
    "ET_NUMA_BINDING", "ET_RETRY_FOR", "ET_GROUP_TIMEOUT",
)
#: never settable by a job: the loader's and interpreters' search paths and hooks, the shell's
#: start-up files, and what etrun or the node daemon set for the job (its credential, its GPUs)
ENV_NEVER = ("LD_*", "DYLD_*", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONUSERBASE",
             "PYTHONEXECUTABLE", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PATH", "HOME", "USER", "LOGNAME", "SHELL",
             "BASH_ENV", "ENV", "IFS", "GCONV_PATH", "GLIBC_TUNABLES", "MALLOC_*", "NLSPATH", "LOCPATH",
             "HOSTALIASES", "RES_OPTIONS", "TMPDIR", "PERL5*", "RUBY*", "NODE_OPTIONS", "CUDA_VISIBLE_DEVICES",
             "ET_TOKEN*", "ET_COORDINATOR", "ET_JOB*", "ET_RUN", "ET_NODE_*", "ET_GROUP_MEMBERS", "ET_LOG_DIR",
             "ET_STATE_DIR", "ET_CONTROL_DIR", "ET_MEMORY_*", "ET_GENERATION", "ET_PDEATHSIG", "ET_PERSIST_MARKER")


def check_job_env(env: dict[str, str], allow: Iterable[str] = DEFAULT_ENV_ALLOW) -> None:
    """Refuse a job environment with a variable outside the allow list.

    Raises:
        ConfigError: the first such name, the rule it breaks and the fix.
    """
    allow = tuple(allow)
    for name in sorted(env):
        hit = next((p for p in ENV_NEVER if fnmatch.fnmatchcase(name, p)), None)
        if hit is not None:
            raise ConfigError(f"environment variable {name} cannot be set for a job (rule: {hit} is never passed; "
                              "it changes how programs load or what the node gives the job); set it inside the "
                              "script if you need it")
        if not any(fnmatch.fnmatchcase(name, p) for p in allow):
            raise ConfigError(f"environment variable {name} is not on the coordinator's allow list (OMP_*, NCCL_*, "
                              "TORCH_*, HF_*, JOB_*, APP_*, ...; docs/security.md lists it); rename it JOB_... or ask "
                              "an admin to add it with `elastictrain coordinator --job-env-allow PATTERN`")


def check_job_command(command: list[str], module: bool) -> None:
    """A job's command is its script (or module) and the script's arguments, nothing else: etrun's
    own flags come from named ``submit`` options.

    Raises:
        ConfigError: the command starts with an option, names a module that is not one, or has
        a lone ``:`` (it separates the jobs of an interleaving group).
    """
    first = command[0]
    if not first or first.startswith("-"):
        raise ConfigError(f"the command must start with the script (or, with --module, a module), not {first!r}: "
                          "etrun's options come from submit's own (--gpus, --max-restarts, --grace, --module ...), "
                          "never from the command")
    if module and not all(p.isidentifier() for p in first.split(".")):
        raise ConfigError(f"--module {first!r} is not a module name (dotted Python identifiers)")
    if ":" in command[1:]:
        raise ConfigError("a lone ':' cannot be a job argument: it separates the scripts of an interleaving group; "
                          "quote it into another argument (e.g. --sep=:)")


def _check_unix_name(name: str) -> None:
    import re

    if not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}\$?", name or ""):
        raise ConfigError(f"UNIX account name {name!r} is invalid: 1-32 characters from [a-z0-9_.-], starting with a "
                          "letter or _")
