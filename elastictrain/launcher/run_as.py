"""The UNIX account a node daemon starts a task as, and the environment the task gets.

A user's jobs run as its UNIX account (``elastictrain users add alice --unix-user alice``), as
Slurm runs a job as its submitter: a daemon started as root switches to that account (its uid,
its primary and supplementary groups) between fork and exec. The rules:

* never root, unless an admin allowed it (the admin's own jobs, or ``users add --allow-root``);
* a daemon that is not root runs only jobs of its own account, and says so for any other;
* the working directory must be one the account itself may enter (checked as the account);
* a job run as another account gets a clean environment (the daemon's locale and time zone, the
  account's HOME, USER, LOGNAME and SHELL, a standard PATH) plus the job's own variables, which
  the coordinator filtered through its allow list; never the daemon's credential.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Optional

__all__ = ["Account", "RunAsError", "resolve", "task_base_env", "SAFE_PATH"]

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_CREDENTIAL_VARS = ("ET_TOKEN", "ET_TOKEN_FILE")


class RunAsError(Exception):
    """A task cannot start as the account it names; the message says why and what to do."""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple
    home: str
    shell: str
    switch: bool  # another account than the daemon's: switch to it between fork and exec


def resolve(run_as: str, allow_root: bool, node: str) -> Account:
    """The account a task runs as on this node.

    Raises:
        RunAsError: no such account, root without an admin's leave, or another account than a
        non-root daemon's own.
    """
    me = os.geteuid()
    if not run_as:
        pw = pwd.getpwuid(me)
    else:
        try:
            pw = pwd.getpwnam(run_as)
        except KeyError:
            raise RunAsError(f"node {node} has no UNIX account {run_as!r}; create it there (useradd {run_as}), or have "
                             "an admin map the user to an existing one (elastictrain users add NAME --unix-user "
                             "ACCOUNT)") from None
    if pw.pw_uid == 0 and not allow_root:
        raise RunAsError(f"the job would run as root on node {node}; jobs run as root only where an admin allows it "
                         "(users add NAME --allow-root)")
    if me != 0 and pw.pw_uid != me:
        raise RunAsError(f"the node daemon on {node} runs as {pwd.getpwuid(me).pw_name}, not root, so it cannot start "
                         f"jobs as {pw.pw_name}; run the daemon as root (as slurmd runs), or one daemon per account")
    groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    return Account(pw.pw_name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir, pw.pw_shell or "/bin/sh", pw.pw_uid != me)


def task_base_env(acct: Account, daemon_env: Optional[dict] = None) -> dict[str, str]:
    """The environment a task starts from, before its own variables are added."""
    daemon_env = dict(os.environ if daemon_env is None else daemon_env)
    for k in _CREDENTIAL_VARS:
        daemon_env.pop(k, None)
    if not acct.switch:  # the daemon's own account: what the daemon has (its operator set it up)
        return daemon_env
    env = {k: v for k, v in daemon_env.items() if k in ("LANG", "LANGUAGE", "TZ") or k.startswith("LC_")}
    env.update(PATH=SAFE_PATH, HOME=acct.home, USER=acct.name, LOGNAME=acct.name, SHELL=acct.shell)
    return env


def chown_for(path: str, acct: Account) -> None:
    """Give ``path`` to the task's account (its run directory, its credential file)."""
    if acct.switch:
        os.chown(path, acct.uid, acct.gid)
