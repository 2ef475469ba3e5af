"""The coordinator's wire format, API version 1.

Every request and response body is one of these types, encoded as msgpack
(``application/msgpack``, the default) or JSON (``application/json``, handy with curl).
Decoding checks the schema: unknown fields, missing fields and wrong types are
rejected with a message that names the field (for example
``Expected `int`, got `str` - at `$.offset```).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

import msgspec

from .model import CHECKPOINT_RE, GPU_TYPE_RE, MAX_PRIORITY, MIN_PRIORITY, NAME_RE, DatasetSpec

API_VERSION = 1

__all__ = [
    "UserTickets", "UserQuota",
    "UserInfo", "UserList", "API_VERSION", "Error", "Health", "Version", "JobCreate", "JobInfo", "GenerationCreate",
    "GenerationInfo", "DatasetInfo", "LeaseRequest", "Lease", "LeaseReply", "ShardUpdate",
    "ProgressRequest", "ProgressReply", "CommitRequest", "CommitReply", "RestoreRequest",
    "RestoreReply", "ReleaseRequest", "ReleaseReply", "CommitInfo", "CommitList",
    "StageProfile", "CommProfile", "ProfileReport", "ProfileList", "StepReport", "StepInfo",
    "JobSubmit", "NodeSlots", "ClusterJobInfo", "ClusterJobList", "NodeRegister", "NodeInfo", "TaskState",
    "LogChunk", "NodePoll", "Task", "GroupMember", "MemberResult", "NodeTasks", "NodeLeave", "LogRecord", "LogList", "EventInfo", "EventList",
    "ClusterStatus", "Series", "StragglerInfo", "BatchShares", "AccountCreate", "Credential", "AccountInfo",
    "AccountList", "WhoAmI",
]


# ---------------------------------------------------------------- value ranges
# Every number on the wire has a range, every name a pattern: out of range is a 400 whose reason
# names the field (msgspec: ``Expected `int` <= 65535 - at `$.worker```). Integers stay well
# inside SQLite's 64-bit range; floats must be finite.
Count = Annotated[int, msgspec.Meta(ge=0, le=2**53)]
Worker = Annotated[int, msgspec.Meta(ge=0, le=65535)]
WorldSize = Annotated[int, msgspec.Meta(ge=1, le=65536)]
Gpus = Annotated[int, msgspec.Meta(ge=1, le=65536)]
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=1e12)]
Name = Annotated[str, msgspec.Meta(pattern=rf"^{NAME_RE}\Z")]
#: a job's GPU type: a name, or up to 8 alternatives joined by "|" (model.GPU_TYPE_RE)
GpuType = Annotated[str, msgspec.Meta(pattern=rf"^{GPU_TYPE_RE}\Z")]
#: a checkpoint id: it names a directory and a database key
CheckpointName = Annotated[str, msgspec.Meta(pattern=rf"^{CHECKPOINT_RE}\Z")]
Token = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[\x21-\x7e]+\Z")]
Arg = Annotated[str, msgspec.Meta(max_length=4096, pattern=r"^[^\x00]*\Z")]
EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")]
Path = Annotated[str, msgspec.Meta(min_length=1, max_length=4096, pattern=r"^/[^\x00]*\Z")]
Text = Annotated[str, msgspec.Meta(max_length=65536)]
Short = Annotated[str, msgspec.Meta(max_length=256)]
Updates = Annotated[list["ShardUpdate"], msgspec.Meta(max_length=100_000)]


class _Msg(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=False):
    pass


# The messages that etrun agents, workers, node daemons and the CLI send, and the assignment agents
# and the job listings the CLI receive, leave out fields at their defaults (``omit_defaults=True``):
# a field added later then reaches a peer of the previous release only when it is used, so a cluster
# can be upgraded one process at a time (each side still refuses fields it does not know).


class Error(_Msg):
    error: str
    reason: str


class Health(_Msg):
    status: str


class Version(_Msg):
    api: int
    version: str
    store: str


# ---------------------------------------------------------------- jobs and generations
class JobCreate(_Msg):
    job: Name
    min_workers: WorldSize = 1
    max_workers: WorldSize = 1


class JobInfo(_Msg):
    """A job as the coordinator knows it. ``min_workers``/``max_workers`` count workers; for a
    job launched by etrun, ``min_nodes``/``max_nodes`` are its ``--nnodes`` and ``status`` is its
    rendezvous' state (``running``, ``succeeded``, ``failed``, ``preempted``; ``""`` for a job
    that only uses the library)."""

    job: str
    generation: int
    world_size: int
    min_workers: int
    max_workers: int
    datasets: list[str]
    status: str = ""
    detail: str = ""
    min_nodes: int = 0
    max_nodes: int = 0
    nodes: int = 0  # agents in the current generation


class JobList(_Msg, omit_defaults=True):
    jobs: list[JobInfo]
    #: a page (``limit=N``) that is not the last: the job the next page follows (ask again with ``after=`` it)
    next: str = ""


class GenerationCreate(_Msg):
    """Open generation ``expected + 1`` if the job is still at ``expected`` (compare-and-set).

    Retrying the same request is safe: if the job is already at ``expected + 1`` with the
    same world size, the reply describes that generation.
    """

    expected: Count
    world_size: WorldSize
    reason: Short = "start"


class GenerationInfo(_Msg):
    job: str
    generation: int
    world_size: int
    reason: str


# ---------------------------------------------------------------- datasets and shards
class DatasetInfo(_Msg):
    spec: DatasetSpec
    todo: int
    doing: int
    done: int
    total: int
    finished: bool
    last_commit: Optional[str]
    restored_from: Optional[str]


class LeaseRequest(_Msg, omit_defaults=True):
    generation: Count
    worker: Worker
    #: idempotency key: a retried request with the same id gets the same lease back
    request_id: Token
    #: only hand out shards of epochs <= max_epoch (None: any epoch)
    max_epoch: Optional[Count] = None
    #: positions the worker holds and has not handed to its training loop yet (its ready leases and
    #: the rest of the one it reads); 0: it has nothing left and waits for this lease
    held: Count = 0
    #: positions per second the worker consumed lately (0: not measured yet)
    rate: Annotated[float, msgspec.Meta(ge=0.0, le=1e12)] = 0.0


class Lease(_Msg):
    shard_id: int
    epoch: int
    start: int
    end: int
    #: first unconsumed position; ``start <= offset < end``
    offset: int
    lease_id: int
    ttl: float


class LeaseReply(_Msg, omit_defaults=True):
    lease: Optional[Lease]
    #: no shard of an allowed epoch is left to hand out (others may still be in progress)
    exhausted: bool
    #: every sample of every epoch has been consumed
    finished: bool
    #: no lease now for a worker that still holds data: with it, the worker would still be busy
    #: when the rest of the job has run out (the epoch would end waiting for it); ask again when
    #: what it holds is used up
    later: bool = False


class ShardUpdate(_Msg):
    shard_id: Count
    lease_id: Count
    #: absolute position: everything in ``[start, offset)`` has been consumed
    offset: Count


class ProgressRequest(_Msg):
    """Report consumption and extend every lease this worker holds (a heartbeat)."""

    generation: Count
    worker: Worker
    updates: Updates = []


class ProgressReply(_Msg):
    #: shards in ``updates`` whose lease this worker no longer holds
    lost: list[int]


class CommitRequest(_Msg):
    """One worker's part of checkpoint ``checkpoint`` at training step ``step``.

    ``updates`` lists every shard this worker consumed from since its previous part,
    with the offset reached at the checkpointed step. The commit is complete, and the
    checkpoint's data cursor durable, once all ``world_size`` workers sent their part.
    """

    generation: Count
    worker: Worker
    world_size: WorldSize
    checkpoint: CheckpointName
    step: Count
    updates: Updates = []


class CommitReply(_Msg, omit_defaults=True):
    """``complete``: this part completed the checkpoint; ``parts``: parts in so far;
    ``committed_step``: the step of the dataset's newest complete commit in the sender's
    generation (-1: none yet). Every part a worker sent at or before that step is folded into
    the committed cursor, so the worker may forget the finished shards those parts named."""

    complete: bool
    parts: int
    committed_step: int = -1


class RestoreRequest(_Msg):
    """Reset the dataset to the cursor committed with ``checkpoint`` (None: the beginning).

    Done once per generation; repeating it with the same checkpoint is a no-op.
    """

    generation: Count
    checkpoint: Optional[CheckpointName]


class RestoreReply(_Msg):
    restored_from: Optional[str]
    #: False when this generation had already restored (the call was a repeat)
    reset: bool


class ReleaseRequest(_Msg):
    """A worker leaves: the unconsumed remainder of each shard it holds returns to TODO."""

    generation: Count
    worker: Worker


class ReleaseReply(_Msg):
    returned: int


class CommitInfo(_Msg):
    checkpoint: str
    step: int
    generation: int
    time: float


class CommitList(_Msg):
    commits: list[CommitInfo]


# ---------------------------------------------------------------- agents (etrun) and rendezvous
class AgentJoin(_Msg, omit_defaults=True):
    """An ``etrun`` agent offers itself for the job's next generation."""

    agent: Token
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
    nproc: WorldSize
    #: a free port on ``host``; used as MASTER_PORT if this agent becomes node rank 0
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)]
    min_nodes: WorldSize = 1
    max_nodes: WorldSize = 1
    max_restarts: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 0
    #: seconds without a poll after which an agent counts as lost
    agent_timeout: Annotated[float, msgspec.Meta(ge=0.1, le=86_400.0)] = 10.0
    #: a fixed node rank (torchrun's --node-rank), or -1 to let the coordinator assign one
    node_rank: Annotated[int, msgspec.Meta(ge=-1, le=65535)] = -1
    #: seconds a round with at least min_nodes (but fewer than max_nodes) waits for more agents
    last_call: Annotated[float, msgspec.Meta(ge=0.0, le=3600.0)] = 1.0
    #: the scheduler's run (placement) this agent was started for; 0 outside cluster mode. An
    #: agent of an older run is told to exit.
    run: Annotated[int, msgspec.Meta(ge=0, le=2**31)] = 0
    #: one free port on ``host`` per local worker, for frameworks that want an address per
    #: worker (TensorFlow's ``TF_CONFIG``); empty: the agent offers none
    worker_ports: Annotated[list[Annotated[int, msgspec.Meta(ge=1, le=65535)]], msgspec.Meta(max_length=65536)] = []
    #: a member of the running generation asks for a new one with more workers (``scale_up``):
    #: a Horovod job that went on with its survivors brings their replacements in
    grow: bool = False
    #: the cluster node the agent runs on (``ET_NODE_NAME``, which node daemons and engines set;
    #: empty outside cluster mode): a straggler's node is cordoned by this name
    node: Annotated[str, msgspec.Meta(pattern=rf"^(?:{NAME_RE})?\Z")] = ""
    #: the port of the Horovod rendezvous this agent serves (``--horovod``; 0: none): the workers of
    #: every node meet in node rank 0's (launcher/horovod.py)
    horovod_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0


class AgentPoll(_Msg):
    agent: Token
    #: the generation this agent is running (0 while waiting)
    generation: Count
    #: seconds to hold the answer while the generation runs unchanged (a long poll); 0: answer now
    wait: Annotated[float, msgspec.Meta(ge=0.0, le=60.0)] = 0.0


class Assignment(_Msg, omit_defaults=True):
    generation: int
    node_rank: int
    nnodes: int
    #: global rank of this agent's local rank 0
    rank_offset: int
    world_size: int
    master_addr: str
    master_port: int
    restart_count: int
    reason: str
    prev_world_size: int
    #: ``host:port`` of every worker in global rank order, when every node offered worker ports
    workers: list[str] = []
    #: gradient accumulation steps (``ET_ACCUMULATE``): doubled job-wide after a GPU out-of-memory
    #: failure under ``--oom-policy accumulate``, so each micro-batch halves and the global batch stays
    accumulate: int = 1
    #: node rank 0's Horovod rendezvous port (``AgentJoin.horovod_port``; 0: none), at ``master_addr``
    horovod_port: int = 0


class AgentAction(_Msg):
    #: wait: keep polling; run: run (or keep running) ``assignment``; restart: stop the workers
    #: and join again; exit: the job is over (``status`` says how)
    action: str
    assignment: Optional[Assignment] = None
    status: str = "running"
    detail: str = ""


class AgentReport(_Msg, omit_defaults=True):
    """What an agent's workers did: ``failed`` (counts as a restart), ``succeeded``, ``preempted``."""

    agent: Token
    generation: Count
    event: Short
    detail: Text = ""
    #: with ``failed``: the job's next generations accumulate this many micro-batches per step
    #: (a GPU out-of-memory failure under ``--oom-policy accumulate``; 0: no change)
    accumulate: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 0
    #: with ``failed``: the per-worker memory limit (bytes) the agent's next generations run under,
    #: doubled after an out-of-memory failure (``--memory-limit``; 0: no change)
    memory_limit: Annotated[int, msgspec.Meta(ge=0, le=2**50)] = 0


# ---------------------------------------------------------------- profiles
class StageProfile(_Msg):
    """Mean seconds per iteration of each stage type over ``iterations`` after ``warmup``.

    ``stages`` keeps the order of :data:`elastictrain.runtime.stages.STAGES` (a stage the job
    does not use is 0). ``device``: True when compute/sync were timed with CUDA events.
    """

    worker: Worker
    iterations: Annotated[int, msgspec.Meta(ge=1, le=2**31)]
    warmup: Annotated[int, msgspec.Meta(ge=0, le=2**31)]
    iteration_seconds: Seconds
    stages: Annotated[dict[Short, Seconds], msgspec.Meta(max_length=16)]
    device: bool = False


class CommProfile(_Msg):
    """Gradient communication of one worker: per iteration and per collective, and the model's
    tensor sizes (``skew`` = largest tensor / total, compared with PACKLIMIT by placement)."""

    worker: Worker
    iterations: Count
    collectives_per_iteration: Annotated[float, msgspec.Meta(ge=0.0, le=1e9)]
    bytes_per_iteration: Annotated[float, msgspec.Meta(ge=0.0, le=1e18)]
    seconds_per_collective: Seconds
    seconds_per_iteration: Seconds
    tensor_count: Count
    total_bytes: Count
    largest_bytes: Count
    skew: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
    size_histogram: Annotated[dict[Short, Count], msgspec.Meta(max_length=256)]


class ProfileReport(_Msg):
    stage: Optional[StageProfile] = None
    comm: Optional[CommProfile] = None


class ProfileList(_Msg):
    job: str
    reports: list[ProfileReport]


# ---------------------------------------------------------------- steps (progress measurement)
class StepReport(_Msg):
    """A worker's training step, for measured progress and iteration time (rank 0 sends it)."""

    worker: Worker
    step: Count
    #: the reporting worker's generation: a report of an older one (a worker still stopping
    #: after a restart) is not taken for the new run's progress
    generation: Optional[Count] = None


class StepInfo(_Msg):
    job: str
    step: int
    iteration_time: Optional[float]


# ---------------------------------------------------------------- resource use (every worker)
Gauge = Annotated[float, msgspec.Meta(ge=0.0, le=1e18)]


class ResourceSample(_Msg, omit_defaults=True):
    """One worker's resource use at time ``t`` (seconds since the epoch, the worker's clock).
    GPU fields are None where there is no GPU or no pynvml; ``gpu_absent`` then says why."""

    t: Gauge
    cpu_percent: Gauge  # of one core: 200 = two cores busy
    rss_bytes: Gauge
    read_bytes: Gauge = 0.0  # since the worker started
    write_bytes: Gauge = 0.0
    step: Optional[Count] = None
    step_time: Optional[Gauge] = None  # seconds per step over the sampling period
    gpu_util: Optional[Gauge] = None  # percent
    gpu_mem_used: Optional[Gauge] = None
    gpu_mem_total: Optional[Gauge] = None
    gpu_power_w: Optional[Gauge] = None
    torch_peak_bytes: Optional[Gauge] = None  # torch.cuda.max_memory_allocated
    gpu_absent: Short = ""
    #: seconds per step the rank spent in its own work (its non-``sync`` et.stage spans): unlike the
    #: step time, which a synchronous job's slowest rank sets for all, it shows which rank is slow
    busy_time: Optional[Gauge] = None
    #: samples this rank trained per step (:meth:`Job.local_batch`), where the script asks for its share
    local_batch: Optional[Count] = None


class BatchShares(_Msg, omit_defaults=True):
    """Each rank's share of a step's global batch, from training step ``from_step`` of
    ``generation`` on: ``weights[rank]``, 1.0 for a full share (the coordinator cuts a straggler's);
    ``version`` counts the changes. Workers read it with :meth:`Job.local_batch`."""

    generation: Count
    version: Count
    from_step: Count
    weights: Annotated[list[Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]], msgspec.Meta(max_length=65536)]


class ResourceReport(_Msg):
    worker: Worker
    samples: Annotated[list[ResourceSample], msgspec.Meta(max_length=1024)]


class WorkerResources(_Msg):
    worker: int
    latest: ResourceSample
    history: int  # samples kept for this worker


class StragglerInfo(_Msg):
    """A rank flagged as a straggler: its own work per step over its peers' median, since when,
    the etrun agent (node) that ran it and what was done (e.g. ``excluded for 60 s``)."""

    worker: int
    slowdown: float
    since: float
    agent: str
    action: str


class ResourceList(_Msg, omit_defaults=True):
    job: str
    workers: list[WorkerResources]
    stragglers: list[StragglerInfo] = []
    shares: Optional[BatchShares] = None  # set once a straggler's share of the batch was cut


# ---------------------------------------------------------------- cluster mode (the live scheduler)
class JobSubmit(_Msg, omit_defaults=True):
    """A job for the scheduler (``elastictrain submit``). ``command``: the script (or module)
    and its arguments, run by ``etrun`` on every node the job is placed on, in ``workdir``."""

    command: Annotated[list[Arg], msgspec.Meta(min_length=1, max_length=1024)]
    workdir: Path
    name: Optional[Name] = None
    user: Name = "default"
    priority: Annotated[int, msgspec.Meta(ge=MIN_PRIORITY, le=MAX_PRIORITY)] = 0
    gpus: Gpus = 1
    #: elastic jobs: the fewest workers the job may run with (None: rigid, always ``gpus``)
    min_gpus: Optional[Gpus] = None
    env: Annotated[dict[EnvName, Arg], msgspec.Meta(max_length=256)] = {}
    steps: Optional[Count] = None
    epochs: Optional[Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]] = None
    max_restarts: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 3
    #: seconds the workers get after SIGTERM to checkpoint when the job is preempted
    grace: Annotated[float, msgspec.Meta(ge=0.0, le=3600.0)] = 30.0
    module: bool = False
    #: iterations of the stage profile taken at the job's first start (Muri needs it to group)
    profile_steps: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 20
    #: profile again even if a job of the same command was profiled before
    reprofile: bool = False
    #: the job's stage profile known in advance (seconds per iteration by stage, e.g. from
    #: ``elastictrain profile --json``): used until its workers send a measured one
    stage_times: Optional[Annotated[dict[Short, Seconds], msgspec.Meta(max_length=16)]] = None
    #: jobs it waits for (Slurm's --dependency): ``JOB`` (it runs once JOB finished), ``JOB:any``
    #: (once JOB ended, however), ``JOB:notok`` (once JOB failed or was cancelled), ``singleton``
    #: (once every earlier job of its name and user ended)
    after: Annotated[list[Short], msgspec.Meta(max_length=64)] = []
    #: submitted on hold (Slurm's --hold): it runs only after ``elastictrain release``
    hold: bool = False
    #: a job array (Slurm's --array; ``POST /v1/cluster/arrays``): task indices such as ``0-7``,
    #: ``1,3,5`` or ``0-15:2``, and ``%N`` for at most N tasks at once
    array: Optional[Short] = None
    #: seconds it may hold GPUs in all its runs (Slurm's --time): then its run is stopped (its
    #: workers checkpoint) and it fails with reason TIMEOUT
    time_limit: Optional[Annotated[float, msgspec.Meta(gt=0.0, le=366 * 86_400.0)]] = None
    #: the UNIX time it may start from (Slurm's --begin): until then it waits, not admitted
    begin: Optional[Annotated[float, msgspec.Meta(ge=0.0, le=1e11)]] = None
    #: the project whose quota it counts against (Slurm's --account; None: its user's default)
    project: Optional[Name] = None
    #: the GPU type it must run on (Slurm's --gres=gpu:TYPE:N): words of a node's type, in a row,
    #: ignoring case (``a100`` runs on nodes of ``NVIDIA A100-SXM4-80GB``); ``a100|h100``: any of
    #: them (Slurm's --constraint; a gang may span both); None: any
    gpu_type: Optional[GpuType] = None
    #: where to POST its notifications (Slurm's --mail-user, as a webhook: coordinator/notify.py); the
    #: coordinator's --notify-allow must allow it
    notify: Optional[Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]] = None
    #: what to notify of (Slurm's --mail-type): begin, end, fail, requeue, all (default end)
    notify_on: Annotated[list[Literal["begin", "end", "fail", "requeue", "all"]], msgspec.Meta(max_length=5)] = []


class JobUpdate(_Msg, omit_defaults=True):
    """Change a scheduled job (``elastictrain update``, Slurm's ``scontrol update``): what is
    given changes, the rest stays. A user may lower its own job's priority and time limit, and move
    its waiting job's begin time or change its size (within the quotas); only the admin may raise a
    priority or a time limit (see ``ClusterScheduler.update``)."""

    priority: Optional[Annotated[int, msgspec.Meta(ge=MIN_PRIORITY, le=MAX_PRIORITY)]] = None
    #: seconds it may hold GPUs in all its runs (as ``JobSubmit.time_limit``); 0 lifts the limit
    time_limit: Optional[Annotated[float, msgspec.Meta(ge=0.0, le=366 * 86_400.0)]] = None
    #: the UNIX time a waiting job may start from (Slurm's StartTime=, as ``JobSubmit.begin``); a time
    #: passed (0: now) lets it start at once
    begin: Optional[Annotated[float, msgspec.Meta(ge=0.0, le=1e11)]] = None
    #: a waiting job's workers (Slurm's NumNodes=/TRES=), and its fewest for an elastic job (None
    #: with ``gpus``: rigid, always ``gpus``)
    gpus: Optional[Gpus] = None
    min_gpus: Optional[Gpus] = None
    #: a waiting job's GPU type (Slurm's Gres=gpu:TYPE:N, as ``JobSubmit.gpu_type``); "" lifts it (any)
    gpu_type: Optional[Annotated[str, msgspec.Meta(pattern=rf"^(?:{GPU_TYPE_RE})?\Z")]] = None


class JobRequeue(_Msg, omit_defaults=True):
    """Stop a running job and queue it again (``elastictrain requeue``, Slurm's ``scontrol
    requeue``); ``hold``: and hold it once stopped (``scontrol requeuehold``)."""

    hold: bool = False


class ForecastInfo(_Msg, omit_defaults=True):
    """One job's expected start and end (times on the coordinator's clock; None: not within the
    forecast, or it cannot run, ``why``)."""

    id: str
    name: str
    user: str
    status: str
    gpus: int
    start: Optional[float] = None
    end: Optional[float] = None
    why: str = ""
    assumed: list[str] = []  # what the coordinator assumes of it (a step time, the work left)


class ClusterForecast(_Msg):
    """``GET /v1/cluster/forecast`` (``elastictrain status --start``, Slurm's ``squeue --start``):
    the policy simulated from the cluster as it is now until ``until`` (sim/forecast.py)."""

    policy: str
    now: float
    until: float
    complete: bool  # every job ends within it
    wall: float  # seconds it took
    jobs: list[ForecastInfo]
    stopped: str = ""  # why the simulation stopped early where it failed (what it got so far stands)


class NodeSlots(_Msg):
    node: str
    slots: int
    gpus: list[int] = []


class ClusterJobInfo(_Msg):
    id: str
    name: str
    user: str
    priority: int
    status: str  # queued | running | preempted | finished | failed | cancelled
    gpus: int
    min_gpus: int
    command: list[str]
    workdir: str
    submit_time: float
    start_time: Optional[float]
    end_time: Optional[float]
    attained: float  # seconds placed
    attained_gpu: float  # GPU-seconds placed
    placement: list[NodeSlots]
    preemptions: int
    restarts: int  # worker-failure restarts used (of max_restarts)
    max_restarts: int
    reason: str  # why it is in its state: the root cause of a failure, a preemption's reason ...
    step: int
    steps: Optional[int]
    epochs: Optional[int]
    iteration_time: Optional[float]
    run: int  # placements so far (a resume is a new run)
    stopping: bool  # told to stop; its workers are checkpointing
    info: dict[str, str]  # the policy's view of the job (e.g. its Tiresias queue)
    workers: int = 0  # the worker count of its current (or last) run
    rate: Optional[float] = None  # measured data samples/s of the current run (None: not measured)
    stage_times: list[float] = []  # seconds per iteration in load, preprocess, compute, sync (empty: unknown)
    exit_code: Optional[int] = None  # of the run that ended it (0: finished; None: not ended, or cancelled)
    runs_by_reason: dict[str, int] = {}  # runs after the first, by why each started (preempt, node_lost, ...)
    project: str = ""  # the project its quota is charged to ("": none)
    gpu_type: str = ""  # the GPU type it must run on ("": any)


class ClusterJobList(_Msg, omit_defaults=True):
    jobs: list[ClusterJobInfo]
    #: ended jobs the listing left out (its ``ended=N``: only the N that ended last, of those its filter matches)
    ended_omitted: int = 0
    #: a page (``limit=N``) that is not the last: the job the next page follows (ask again with ``after=`` it)
    next: str = ""


class NodeRegister(_Msg):
    """A node daemon offers its GPUs (or, on a CPU-only machine, slots)."""

    slots: Gpus
    instance: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    kind: str = "gpu"  # gpu | slot
    gpu_type: Annotated[str, msgspec.Meta(max_length=128)] = ""
    host: Annotated[str, msgspec.Meta(max_length=255)] = ""


class NodeInfo(_Msg, omit_defaults=True):
    name: str
    index: int
    slots: int
    used: int
    kind: str
    gpu_type: str
    host: str
    state: str  # up | down | left
    last_seen: float
    jobs: list[str]
    #: > 0 while cordoned: nothing new is placed on it until then (a straggler's node, or
    #: ``elastictrain nodes cordon``); what runs there keeps running
    cordoned_until: float = 0.0
    cordon_why: str = ""
    #: > 0: a maintenance window is planned: from ``maint_start`` to ``maint_end`` (UNIX times) the
    #: node is cordoned (and drained with ``maint_drain``); backfill starts nothing there that would
    #: still run then
    maint_start: float = 0.0
    maint_end: float = 0.0
    maint_drain: bool = False


class NodeCordon(_Msg, omit_defaults=True):
    """(admin) Cordon a node: nothing new is placed on it for ``seconds`` (0: lift its cordon, and
    any maintenance planned). ``drain``: also requeue the jobs running there (they checkpoint and
    resume elsewhere). ``at``: not now but from this UNIX time (a maintenance window, as Slurm's
    ``flags=maint`` reservation), which replaces any planned before."""

    seconds: Annotated[float, msgspec.Meta(ge=0.0, le=30 * 86_400.0)]
    reason: Short = ""
    drain: bool = False
    at: Optional[Annotated[float, msgspec.Meta(ge=0.0, le=1e11)]] = None


class TaskState(_Msg):
    """A task (one job run's etrun agent on one node) as its node daemon sees it."""

    job: Name
    run: Annotated[int, msgspec.Meta(ge=1, le=2**31)]
    state: str  # running | exited
    code: Optional[Annotated[int, msgspec.Meta(ge=-255, le=255)]] = None
    detail: Text = ""


class LogChunk(_Msg):
    job: Name
    run: Annotated[int, msgspec.Meta(ge=1, le=2**31)]
    data: Annotated[bytes, msgspec.Meta(max_length=262144)]


class NodePoll(_Msg):
    """A node daemon's heartbeat: its tasks' states and new output; ``wait``: seconds the
    coordinator may hold the reply until the node's tasks change (a long poll)."""

    instance: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    tasks: Annotated[list[TaskState], msgspec.Meta(max_length=4096)] = []
    logs: Annotated[list[LogChunk], msgspec.Meta(max_length=64)] = []
    wait: Annotated[float, msgspec.Meta(ge=0.0, le=30.0)] = 0.0


class Task(_Msg, omit_defaults=True):
    job: str
    run: int
    slots: int
    gpus: list[int]
    nnodes: int
    command: list[str]
    workdir: str
    env: dict[str, str]
    max_restarts: int
    grace: float
    module: bool
    #: an interleaving group (Muri): the members this task runs as one ``etrun --group`` process
    #: per rank (empty for a job of its own; then ``job`` is the job's id)
    group: list["GroupMember"] = []
    #: each worker's memory limit in bytes, a resource plan's (``etrun --memory-limit``; 0: none)
    memory_limit: Annotated[int, msgspec.Meta(ge=0, le=2**50)] = 0
    #: the run's worker credential (only its own jobs' routes, while the run lives)
    token: str = ""
    #: the UNIX account the task runs as ("": the node daemon's own)
    run_as: str = ""
    #: an admin allowed it to run as root
    allow_root: bool = False

    def __repr__(self) -> str:  # never the credential, in any log line
        return f"Task(job={self.job!r}, run={self.run}, slots={self.slots}, run_as={self.run_as!r})"


class GroupMember(_Msg):
    """One job of a group task: its own id (its datasets, checkpoints, generations and steps stay
    its own), the run of it this task is, and why that run started."""

    job: str
    run: int
    reason: str
    command: list[str]
    workdir: str
    env: dict[str, str]


class MemberResult(_Msg):
    """A grouped job's own outcome, sent by its process while the rest of its group goes on
    (``POST /v1/cluster/jobs/{id}/result``)."""

    run: Annotated[int, msgspec.Meta(ge=1, le=2**31)]
    status: Literal["finished", "failed"]
    detail: Text = ""


class NodeTasks(_Msg):
    """What a node must run now; any other task of this node must stop. ``action``: ``run``, or
    ``register`` when the coordinator does not know this node instance (register again)."""

    action: str
    tasks: list[Task] = []


class NodeLeave(_Msg):
    instance: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class LogRecord(_Msg):
    seq: int
    node: str
    run: int
    data: bytes


class LogList(_Msg):
    job: str
    chunks: list[LogRecord]
    #: pass as ``after`` to get what follows
    next: int
    #: the job has ended (no more output will come once ``chunks`` is empty)
    ended: bool


class EventInfo(_Msg):
    seq: int
    time: float
    kind: str
    job: str
    node: str
    detail: dict[str, Any]


class EventList(_Msg):
    events: list[EventInfo]
    next: int


class JobGpuTime(_Msg):
    """One job's GPU-seconds within a period: allocated (from each run's start) and service (from
    each run's first training step, as the job's own GPU-hours count them)."""

    job: str
    gpu_seconds: float
    service_gpu_seconds: float


class GpuTimeList(_Msg):
    """``GET /v1/cluster/usage?since=&until=``: the jobs that held GPUs within ``[since, until)`` (the
    coordinator's clock, epoch seconds; ``until`` at most ``now``)."""

    now: float
    since: Optional[float]
    until: float
    jobs: list[JobGpuTime]


class AccountCreate(_Msg, omit_defaults=True):
    """``elastictrain users add NAME``: the user's UNIX account on the nodes (default: its name),
    and whether its jobs may run as root."""

    unix_user: Annotated[str, msgspec.Meta(max_length=32)] = ""
    allow_root: bool = False


class Credential(_Msg):
    """A credential just made (``token`` is shown this once), or revoked (``token`` empty)."""

    role: str
    name: str
    token: str

    def __repr__(self) -> str:
        return f"Credential(role={self.role!r}, name={self.name!r})"


class AccountInfo(_Msg):
    user: str
    unix_user: str
    allow_root: bool
    created: float


class AccountList(_Msg):
    users: list[AccountInfo]
    nodes: list[str]


class WhoAmI(_Msg):
    """The caller as the coordinator sees it (``GET /v1/whoami``)."""

    role: str
    name: str
    run: int = 0
    jobs: list[str] = []
    unix_user: str = ""


class UserTickets(_Msg):
    """A user's tickets: GPU time is shared in proportion to them (Gandiva-fair)."""

    tickets: Annotated[float, msgspec.Meta(gt=0.0, le=1_000_000.0)]


class UserQuota(_Msg, omit_defaults=True):
    """(admin) A user's own quota: the most GPUs (counting each admitted job at its ``--gpus``) and
    jobs its admitted jobs may hold (a number left out is no limit), and the highest priority it may
    submit at. ``default``: drop the user's
    own quota (the coordinator's ``--quota-gpus``/``--quota-jobs`` apply again)."""

    gpus: Optional[Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]] = None
    jobs: Optional[Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]] = None
    default: bool = False
    #: the highest priority the user may give its jobs under ``--priority-preemption`` (None: 0)
    max_priority: Optional[Annotated[int, msgspec.Meta(ge=0, le=MAX_PRIORITY)]] = None


class ProjectSet(_Msg, omit_defaults=True):
    """(admin) Create or change a project (``elastictrain projects set``): the most GPUs (each admitted
    job at its ``--gpus``) and jobs its members' admitted jobs may hold together (a number left out
    is no limit), and its members (None: they stay as they were)."""

    gpus: Optional[Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]] = None
    jobs: Optional[Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]] = None
    users: Optional[Annotated[list[Name], msgspec.Meta(max_length=10_000)]] = None
    #: its fair-share tickets (Gandiva-fair: one share beside the users, split among its members with
    #: jobs; policies/shares.py); 0: none, its jobs count against their users; None: as they were
    tickets: Optional[Annotated[float, msgspec.Meta(ge=0.0, le=1_000_000.0)]] = None
    remove: bool = False
    #: the project it is a sub-project of (its quota holds too; projects.py); "": none; None: as it was
    parent: Optional[Annotated[str, msgspec.Meta(pattern=rf"^(|{NAME_RE})\Z")]] = None
    #: with ``users``: members' own fair-share weights in this project (Slurm's per-association
    #: fairshare; policies/shares.py), in place of their users' tickets; members left out have none
    shares: Optional[Annotated[dict[Name, Annotated[float, msgspec.Meta(gt=0.0, le=1_000_000.0)]],
                               msgspec.Meta(max_length=10_000)]] = None


class ProjectInfo(_Msg):
    name: str
    gpus: Optional[int]  # its limit (None: none)
    jobs: Optional[int]
    users: list[str]
    used_gpus: int  # what its admitted jobs count now
    used_jobs: int
    queued: int  # its jobs waiting for admission
    gpu_hours: float = 0.0  # what its jobs the coordinator still keeps have received (sshare's usage, not decayed)
    tickets: float = 0.0  # its fair-share tickets (0: none: its members' jobs count against them)
    entitled: float = 0.0  # the share of the GPUs its tickets entitle it to, among the accounts with jobs (0: none)
    parent: str = ""  # the project it is a sub-project of ("": none); its figures include its sub-projects'
    shares: dict[str, float] = {}  # members' own fair-share weights here (where set: projects set --users alice=3)


class ProjectList(_Msg):
    projects: list[ProjectInfo]


class UserInfo(_Msg, omit_defaults=True):
    user: str
    tickets: float
    #: whether ``tickets`` were set (``elastictrain users set``) or are the default
    set: bool
    #: the share of the cluster's GPUs its tickets entitle it to, among users with jobs
    entitled: float
    #: its share of the GPU-seconds used over the window
    share: float
    gpu_seconds: float
    running_gpus: int
    jobs: int
    #: its quota (``elastictrain users quota``; None: no limit) and whether it is its own
    quota_gpus: Optional[int] = None
    quota_jobs: Optional[int] = None
    quota_own: bool = False
    #: the highest priority it may give its jobs under --priority-preemption (its quota's; 0 if none)
    max_priority: int = 0
    #: GPUs its admitted jobs count against the quota, and its jobs waiting for the quota
    admitted_gpus: int = 0
    waiting_for_quota: int = 0
    #: under multifactor (Slurm's sshare): its own account's share of the recent GPU time (decayed)
    #: and fair-share factor at the last decision; None under other policies or without jobs or usage
    usage: Optional[float] = None
    fairshare: Optional[float] = None


class UserList(_Msg):
    users: list[UserInfo]
    #: seconds the shares are measured over (shorter while the coordinator has run less)
    window: float
    #: whether the policy uses tickets (gandiva-fair); others only report the shares
    tickets_used: bool
    default_tickets: float


class Series(_Msg):
    """A time series the status page draws: ``times`` (epoch seconds) and one or more value lists
    of the same length (``GET /v1/cluster/utilization``: GPUs in use and in all; ``GET
    /v1/cluster/jobs/{id}/steps``: the job's reported step)."""

    name: str
    times: list[float]
    values: dict[str, list[float]]


class ClusterStatus(_Msg, omit_defaults=True):
    policy: Optional[str]
    now: float
    nodes: list[NodeInfo]
    jobs: list[ClusterJobInfo]
    decisions: int
    failures: int
    #: ended jobs the listing left out (``GET /v1/cluster?ended=N``: only the N that ended last, of those its
    #: filter matches)
    ended_omitted: int = 0
    #: a page (``limit=N``) that is not the last: the job the next page follows (``after=`` it; the next
    #: pages' jobs come from ``/v1/cluster/jobs``, which takes the same query)
    next: str = ""
