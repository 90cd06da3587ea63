"""reconcile(job_id): observe → decide → record → act, repeated until there is nothing left to do right now.

Observe: the job document, each member slot's node as the Compute Engine or Cloud TPU API shows it and its
heartbeat (job.MemberObs; a one-node job is one slot) and the node it replaced during its notice (while recorded),
the zones under a capacity cooldown (only when decide may place a node: observation.needs_capacity), the tail of a
node's serial console (only when decide may call it a boot failure: observation.needs_console), a member's address
(only when the job forms generations: job.needs_address).
Decide: functions/job.py, the one entry of the pure core (each slot through functions/decide.py). Record: the new
status (and its lifecycle event) is committed atomically, conditional on the job document being unchanged since it
was observed (an optimistic transaction, see adapters/firestore_store.py), *before* the side effect; if it changed
(a concurrent delivery got there first, the user cancelled) nothing is written and the loop observes again. Act:
create (409 → adopt), start, delete (404 → done; every node a job leaves at once: job.DeleteNodes): all idempotent.

Outcomes: _act performs the call and classifies how it ended (outcomes.Outcome, from placement.classify); what that
means is pure policy: job.followup() (re-raise, cool the zone down) and job.after_act() (what to commit on the
job's status read again, the alert, the delete of a node made for a placement the job has left). So capacity/quota
refusals are recorded (capacity/{zone}~{accel}, and the job's round) and placement goes on; a request that no zone
can satisfy fails the job; anything transient propagates, so the platform redelivers the event and the next
delivery resumes from what was recorded.

Dependencies (Deps) are typed by ports.py's Protocols; their configuration is settings.ControlSettings, read from
the environment once per Deps.default().
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping

from pydantic import ValidationError

from respawn.images import ImageCheck, ImageVerdict
from respawn import advice, contract, deployment, logs, prices, topology
from respawn.advice import ZoneAdvice
from respawn.schema import (CONSOLE_TAIL_CHARS, DEFAULT_MODEL, AdviceRecord, Heartbeat, JobEvent, JobSpec, JobStatus,
                            MemberStatus, SpecError, State)

from . import composition, costs, identities, job, observation, outcomes, placement, stats
from .models import queued
from .actions import NONE, Act, Action, Decision
from .observation import Hint, NodeObs, Observation, Settings
from .ports import AdviceSource, ControlStore, FolderGrants, NodeProvider, PriceSource
from .settings import ControlSettings


@dataclass(frozen=True)
class Config:
    settings: Settings = Settings()
    poll_seconds: float = 5.0  # how often a transition under way is looked at again
    poll_budget_seconds: float = 120.0  # how long one invocation waits on transitions before leaving it to the sweep
    max_passes: int = 40

    @classmethod
    def from_settings(cls, s: ControlSettings) -> "Config":
        policy = Settings(stale_heartbeat_seconds=s.stale_heartbeat_seconds, boot_grace_seconds=s.boot_grace_seconds,
                          backoff_base_seconds=s.backoff_base_seconds, max_in_place_restarts=s.max_in_place_restarts,
                          progress_timeout_seconds=s.progress_timeout_seconds,
                          budget_lookahead_seconds=s.budget_lookahead_seconds)
        return cls(policy, s.poll_seconds, s.poll_budget_seconds)


@dataclass
class Deps:
    """What reconcile talks to (ports.py); Deps.default() builds it from the environment, through
    respawn.control.settings and respawn.control.clients (the adapters are imported there, lazily)."""

    store: ControlStore
    # "gpu" → ComputeProvider, "tpu" → TpuProvider, "tpu-queued" → QueuedTpuProvider (queued.provider_key(spec))
    providers: Mapping[str, NodeProvider]
    publish: Callable[[dict[str, Any]], Any]
    project: str
    startup_script: Callable[[], str]
    config: Config = field(default_factory=Config)
    identities: tuple[str, ...] = ()  # the node identity pool (identities.py); empty: the default service account
    grants: FolderGrants | None = None  # who may use a checkpoint folder (needed when `identities` is not empty)
    advice: AdviceSource | None = None  # capacity advice for jobs with placement.rank: advice (None: never asked)
    # Writes a job's goodput to Cloud Monitoring (adapters/monitoring.py) when it recovers or ends; None: never.
    metrics: Callable[[str, JobSpec], Any] | None = None
    prices: PriceSource | None = None  # the node prices (None: the dated offline table; respawn/prices.py)
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
    sleep: Callable[[float], None] = time.sleep

    @classmethod
    def default(cls, settings: ControlSettings | None = None) -> "Deps":
        """The production dependencies, configured by `settings` (default: read from the environment now)."""
        from . import clients
        from .adapters import pubsub
        from .adapters.advice import AdviceReader
        from .adapters.compute import ComputeProvider
        from .adapters.firestore_store import Store
        from .adapters.managed_folders import FolderGrants as StorageFolderGrants
        from .adapters.monitoring import write_goodput
        from .adapters.prices import CatalogPrices
        from .adapters.tpu import QueuedTpuProvider, TpuProvider

        s = settings if settings is not None else ControlSettings.from_env()
        c = clients.default(s)
        providers = {"gpu": ComputeProvider(c, op_timeout=s.compute_op_timeout_seconds, nodes=s.nodes),
                     "tpu": TpuProvider(c, op_timeout=s.tpu_op_timeout_seconds, nodes=s.nodes),
                     queued.PROVIDER: QueuedTpuProvider(c, op_timeout=s.tpu_op_timeout_seconds, nodes=s.nodes)}
        return cls(store=Store(c.firestore(), c.firestore_database), providers=providers,
                   publish=lambda alert: pubsub.publish_alert(c, alert, topic=s.alerts_topic,
                                                              timeout=s.alert_publish_timeout_seconds),
                   project=c.project, startup_script=deployment.startup_script, config=Config.from_settings(s),
                   identities=s.nodes.identities, grants=StorageFolderGrants(c), advice=AdviceReader(c),
                   metrics=(lambda job_id, spec: write_goodput(c, c.project, job_id, spec, s.monitoring_endpoint))
                   if s.writes_goodput else None,
                   prices=CatalogPrices(clients=c))


@dataclass(frozen=True)
class Result:
    """What one reconcile of a job left to do (as controller-runtime's Result): nothing until the next event
    (requeue_after None), or to be looked at again after `requeue_after` seconds, with the event's `hint` still
    unconsumed (no action was taken on the node it described)."""

    job_id: str
    found: bool = True  # False: no such job (the event was about a node no job owns)
    requeue_after: float | None = None
    hint: Hint | None = None


def observe(deps: Deps, job_id: str, hint: Hint | None, image_checks: dict[str, ImageCheck | None] | None = None,
            ) -> tuple[Observation, JobSpec | None, Any, list[job.MemberObs]] | None:
    """What decide() needs: the job, what each member slot's node is (job.MemberObs), and the job document's
    version (its update_time) that a commit is conditional on. `image_checks`: boot images already checked in this
    invocation (image path → check), so that a pass repeated after a conflicting write asks Compute Engine once."""
    found = deps.store.job(job_id)
    if found is None:
        return None
    doc, version = found
    try:
        status = JobStatus.model_validate(doc.get("status") or {})
    except ValidationError as exc:
        logs.error(f"job {job_id}: status is unreadable ({exc.error_count()} errors); starting from an empty status",
                   job_id=job_id)
        status = JobStatus()
    spec, errors = None, ()
    try:
        spec = composition.admit(doc.get("spec"), stored=True)
        if spec.id != job_id:
            raise SpecError([f"id: {spec.id!r} does not match the document id {job_id!r}"])
    except SpecError as exc:
        spec, errors = None, tuple(exc.errors)
    now = deps.now()
    consoles: dict[str, str | None] = {}
    members = job.slots(status, spec.slots if spec else len(status.members))
    seen = _observe_members(deps, job_id, spec, members, hint, now, consoles)
    blocked, ranks = {}, {}
    if spec is not None and any(observation.needs_capacity(m, ob.node, ob.hint) for m, ob in zip(members, seen)):
        blocked = deps.store.blocked(spec.zones, placement.accelerator_key(spec))
        ranks = _zone_advice(deps, job_id, spec, now)
    cancel_requested = bool(doc.get("cancel_requested"))
    image = None
    if spec is not None and status.state is State.PENDING and not cancel_requested:
        image = _check_image(deps, job_id, spec, {} if image_checks is None else image_checks)
    quote = _quote(deps, spec, status, now) if spec is not None and costs.needs_quote(status) else None
    o = Observation(job_id=job_id, spec=spec, spec_errors=errors, status=status, cancel_requested=cancel_requested,
                    node=observation.ABSENT, heartbeat=None, now=now, blocked=blocked, settings=deps.config.settings,
                    image=image, consoles=consoles, advice=ranks, quote=quote)
    return o, spec, version, seen


def _quote(deps: Deps, spec: JobSpec, status: JobStatus, now: datetime) -> prices.Quote:
    """The job's node prices in the region of its zone (the catalog's through deps.prices, cached for every job;
    without a price source, the offline table)."""
    region = prices.region_of(status.zone or spec.zones[0])
    book = deps.prices.book(region, now) if deps.prices is not None else prices.offline(region)
    quote = (prices.quote(spec.accelerator, book) if book is not None else
             prices.Quote({}, f"the offline table of {prices.OFFLINE_DATE} has no prices for {region}"))
    if quote.why is not None:
        logs.warning(f"job {spec.id}: its node cannot be priced ({quote.why}); its cost so far leaves "
                     f"it out{' and its budget cannot stop it' if spec.budget else ''}. Enable the Cloud Billing "
                     "Catalog API for the controller (docs/gcp-facts.md §24) or add the region to "
                     "respawn/prices.py's offline table", job_id=spec.id, region=region)
    return quote


def _zone_advice(deps: Deps, job_id: str, spec: JobSpec, now: datetime) -> dict[str, ZoneAdvice]:
    """zone → capacity advice for a GPU job that asks (placement.rank: advice): each zone × machine shape asked at
    most once per advice.CACHE_SECONDS for every job (the store's advice records), an answer or a failure alike.
    After a failure no other zone is asked in this pass: one WARNING says why, and the zones keep the order listed."""
    shape = advice.shape_of(spec.accelerator)
    if spec.placement.rank != "advice" or shape is None or deps.advice is None:
        return {}
    key = shape.key(spec.nodes)
    cached = deps.store.zone_advice(spec.zones, key)
    out: dict[str, ZoneAdvice] = {}
    for zone in spec.zones:
        record = cached.get(zone)
        if record is None or record.until <= now:
            try:
                got = deps.advice.capacity(zone, shape, spec.nodes)
                error = None if got is not None else "the answer has no recommendation for the zone"
            except Exception as exc:  # noqa: BLE001 - any failure: the zones keep the order the user gave
                got, error = None, f"{type(exc).__name__}: {exc}"[:300]
            record = AdviceRecord(zone=zone, shape=key, obtainability=got and got.obtainability,
                                  uptime_seconds=got and got.uptime_seconds, error=error, fetched_at=now,
                                  until=now + timedelta(seconds=advice.CACHE_SECONDS))
            deps.store.record_advice(record)
            if error is not None:
                logs.warning(f"job {job_id}: capacity advice for {key} in {zone} failed ({error}); its zones keep "
                             f"the order listed for {advice.CACHE_SECONDS} s. advice.capacity needs the controller's "
                             "compute.advice.capacity permission and the API (Preview, docs/gcp-facts.md §20); or "
                             "drop placement.rank", job_id=job_id, zone=zone, shape=key)
                break
        if record.error is None and record.obtainability is not None:
            out[zone] = ZoneAdvice(record.obtainability, record.uptime_seconds)
    return out


def _observe_members(deps: Deps, job_id: str, spec: JobSpec | None, members: list[MemberStatus], hint: Hint | None,
                     now: datetime, consoles: dict[str, str | None]) -> list[job.MemberObs]:
    """Each member slot's node as the API shows it, its heartbeat (a TPU slice's: every worker's), its address when
    the job's core needs it, and the event's hint when the event named that node's current life; into `consoles`,
    the console of a member that decide may call a boot failure."""
    kind = spec.accelerator.kind if spec else "gpu"
    provider = deps.providers[queued.provider_key(spec)]
    # The heartbeats are in the database of the identity the job holds: no other job's node can write there.
    database = deployment.heartbeat_database(deps.store.identity_of(job_id) if deps.identities else None)
    seen = []
    for m in members:
        if not (m.node and m.zone):
            seen.append(job.MemberObs())
            continue
        raw = provider.get(m.zone, m.node)
        node = NodeObs(observation.phase_of(kind, raw), raw)
        leaving = leaving_hb = None
        if m.leaving is not None:  # whether it is off yet: then decide deletes it at once (decide.decide)
            gone = provider.get(m.leaving.zone, m.leaving.node)
            leaving = NodeObs(observation.phase_of(kind, gone), gone)
            # Its final heartbeat says how its emergency save ended, after the loss was recorded at the notice.
            leaving_hb = observation.slice_heartbeat([_heartbeat(deps, job_id, contract.heartbeat_id(m.leaving.node, w),
                                                                 database) for w in range(_workers(spec))])
        address = m.address
        if job.needs_address(spec, m, node):
            address = provider.address(m.zone, m.node)
        heartbeat = observation.slice_heartbeat([_heartbeat(deps, job_id, contract.heartbeat_id(m.node, w), database)
                                                 for w in range(_workers(spec))])
        if observation.needs_console(m, node, heartbeat, deps.config.settings, now):
            consoles[m.node] = _console(deps, job_id, kind, m.zone, m.node)
        seen.append(job.MemberObs(node, heartbeat, address, hint.about(m.node, m.node_started_at) if hint else None,
                                  leaving, leaving_hb))
    return seen


def _console(deps: Deps, job_id: str, kind: str, zone: str, node: str) -> str | None:
    """The end of a node's serial console (None: its provider has none). A read that fails must not hold the
    recovery back: its error is recorded in the console's place."""
    try:
        tail = deps.providers[kind].console_tail(zone, node, CONSOLE_TAIL_CHARS)
    except Exception as exc:  # noqa: BLE001 - the boot failure is recorded either way; the error says why no tail
        logs.warning(f"job {job_id}: could not read the serial console of {node} in {zone}: {exc}", job_id=job_id,
                     node=node)
        return f"(the console could not be read: {type(exc).__name__}: {exc})"[:CONSOLE_TAIL_CHARS]
    logs.info(f"job {job_id}: {node} never reported after its boot; read the end of its console", job_id=job_id,
              node=node, chars=len(tail) if tail is not None else None)
    return tail


def _workers(spec: JobSpec | None) -> int:
    """The hosts whose heartbeats make the node's: a multi-host TPU slice's worker VMs, else one."""
    if spec is None or spec.accelerator.kind != "tpu":
        return 1
    try:
        return topology.tpu_hosts(spec.accelerator.accelerator_type)
    except ValueError:  # a type this version does not know: worker 0 alone, as before
        return 1


def _heartbeat(deps: Deps, job_id: str, doc_id: str, database: str) -> Heartbeat | None:
    hb = deps.store.heartbeat(doc_id, database)
    if hb is None:
        return None
    try:
        return Heartbeat.model_validate(hb)
    except ValidationError as exc:
        logs.warning(f"heartbeat {doc_id} is unreadable ({exc.error_count()} errors); ignored", job_id=job_id,
                     node=doc_id)
        return None


def _check_image(deps: Deps, job_id: str, spec: JobSpec, checked: dict[str, ImageCheck | None]) -> ImageCheck | None:
    """The job's boot image as the provider sees it, asked when the job is first handled (decide: PENDING)."""
    key = f"{spec.accelerator.kind}:{getattr(spec.accelerator, 'boot_image', '')}"
    if key in checked:
        return checked[key]
    check = checked[key] = deps.providers[spec.accelerator.kind].check_image(spec)
    if check is None:
        return None
    if check.verdict is ImageVerdict.FOUND:
        logs.info(f"job {job_id}: boot image {check.image} is {check.detail}", job_id=job_id, image=check.image)
    elif check.verdict is ImageVerdict.UNCHECKED:
        logs.warning(f"job {job_id}: could not check boot image {check.image} ({check.detail}); going on: if it does "
                     "not exist, the first create fails the job with Compute Engine's answer", job_id=job_id,
                     image=check.image)
    return check


def _commit(deps: Deps, job_id: str, version: Any, after: JobStatus, event: JobEvent | None) -> bool:
    return deps.store.commit(job_id, version, after.model_dump(), event)


def reconcile(job_id: str, hint: Hint | None = None, *, deps: Deps | None = None) -> Result:
    """Reconcile the job until it needs nothing for now: a transition under way is looked at again (requeued) while
    this invocation's budget lasts (Config.poll_budget_seconds), then left to the sweep."""
    deps = deps or Deps.default()
    reads, writes, started = deps.store.reads, deps.store.writes, time.monotonic()
    deadline = started + deps.config.poll_budget_seconds
    try:
        while True:
            result = reconcile_once(job_id, hint, deps)
            if result.requeue_after is None:
                return result
            if time.monotonic() + result.requeue_after > deadline:
                logs.info(f"job {job_id}: still in transition; the sweep will look again", job_id=job_id)
                return result
            deps.sleep(result.requeue_after)
            hint = result.hint
    finally:
        # Per invocation: what it cost in Firestore operations and time (bench/controller.py sums these).
        logs.info(f"job {job_id}: reconcile finished", job_id=job_id, firestore_reads=deps.store.reads - reads,
                  firestore_writes=deps.store.writes - writes, duration_ms=round((time.monotonic() - started) * 1000, 1))


def reconcile_once(job_id: str, hint: Hint | None, deps: Deps) -> Result:
    """One reconcile: observe → decide → record → act, pass after pass, until nothing is left to do at once; what it
    returns says whether (and when) to look again."""
    cfg = deps.config
    image_checks: dict[str, ImageCheck | None] = {}
    for _ in range(cfg.max_passes):
        observed = observe(deps, job_id, hint, image_checks)
        if observed is None:
            logs.info(f"no job {job_id}: nothing to reconcile", job_id=job_id)
            return Result(job_id, found=False)
        o, spec, version, seen = observed
        d = job.decide(o, seen)
        if d.status is not None:
            if not _commit(deps, job_id, version, d.status, job.event(o, d)):
                logs.info(f"job {job_id}: status changed concurrently; observing again", job_id=job_id)
                continue
            _record_stats(deps, job_id, spec, o.status, d.status)
            if d.status.state != o.status.state:
                logs.info(f"job {job_id}: {o.status.state.value} → {d.status.state.value} ({d.cause})", job_id=job_id,
                          node=d.status.node, zone=d.status.zone, attempt=d.status.attempt, action=d.action.kind.value)
        a = d.action
        if a.kind in (Act.CREATE, Act.START, Act.DELETE, job.JobAct.SET_GENERATION, job.JobAct.DELETE_NODES):
            hint = None  # the event described the node before this action; from here on only observation counts
            _act(deps, o, spec, d)
        if d.alert is not None:
            deps.publish(d.alert)
        if d.status is not None and (d.cause == "recovered" or (d.status.state.terminal and not o.status.state.terminal)):
            _write_goodput(deps, job_id, spec)
        if a.kind is Act.POLL:
            return Result(job_id, requeue_after=cfg.poll_seconds, hint=hint)
        if a.kind is Act.WAIT or (a.kind is Act.NONE and d.status is None):
            return Result(job_id)  # nothing to do before the next event or sweep
    logs.warning(f"job {job_id}: still changing after {cfg.max_passes} passes; the next event or sweep continues",
                 job_id=job_id)
    return Result(job_id)


def _write_goodput(deps: Deps, job_id: str, spec: JobSpec | None) -> None:
    """The job's goodput to Cloud Monitoring, after a recovery or at its end: best effort, never in the way."""
    if deps.metrics is None or spec is None:
        return
    try:
        deps.metrics(job_id, spec)
    except Exception as exc:  # noqa: BLE001 - Monitoring down or refusing must not stop the recovery
        logs.warning(f"job {job_id}: writing its goodput to Cloud Monitoring failed: {type(exc).__name__}: {exc}; "
                     "the controller needs monitoring.timeSeries.create (roles/monitoring.metricWriter)",
                     job_id=job_id)


def _record_stats(deps: Deps, job_id: str, spec: JobSpec | None, before: Any, after: Any) -> None:
    """Add what a committed decision showed of its zones to every job's statistics (functions/stats.py)."""
    if spec is None or not isinstance(before, JobStatus) or not isinstance(after, JobStatus):
        return
    for seen in stats.observed(before, after, deps.now()):
        _add_stats(deps, job_id, seen.zone, placement.accelerator_key(spec), seen.model, seen.counts)


def _add_stats(deps: Deps, job_id: str, zone: str, accelerator: str, model: str, counts: dict[str, float]) -> None:
    """Statistics are best effort: a write that fails is logged and never holds the recovery back (nor redelivers
    the event, which would count the rest twice)."""
    try:
        deps.store.record_stats(zone, accelerator, model, counts)
    except Exception as exc:  # noqa: BLE001 - see above
        logs.warning(f"job {job_id}: could not add {counts} to the statistics of {model} {accelerator} in {zone} "
                     f"({type(exc).__name__}: {exc}); they miss it", job_id=job_id, zone=zone)


def _act(deps: Deps, o: Observation, spec: JobSpec | None, d: Decision) -> None:
    """Perform the action, classify how it ended, and carry out what the policy (job.followup, job.after_act)
    says that outcome means: re-raise, record the zone's refusal, commit the job's status, publish, delete."""
    a = d.action
    provider = deps.providers[queued.provider_key(spec)]
    error: Exception | None = None
    try:
        outcome = _perform(deps, o, spec, a, provider)
    except Exception as exc:  # noqa: BLE001 - classified; what the policy says to retry is re-raised below
        error, outcome = exc, outcomes.Outcome.of(placement.classify(exc))
    f = job.followup(spec, a, outcome, deps.now())
    if f.propagate and error is not None:
        raise error
    if f.capacity is not None:
        deps.store.record_capacity(f.capacity)
        _add_stats(deps, o.job_id, f.capacity.zone, f.capacity.accelerator_type, a.provisioning or DEFAULT_MODEL,
                   {"refusals": 1})
        logs.warning(f"{a.zone} refused {a.node}: {outcome.kind.value} ({outcome.code}); the zone cools down for "
                     f"{spec.placement.cooldown_seconds if spec else '?'} s", job_id=o.job_id, zone=a.zone,
                     code=outcome.code)
    elif error is not None and f.record and outcome.kind is not outcomes.OutcomeKind.EXISTS:
        logs.error(f"{a.kind.value} of {a.node} in {a.zone} failed and no other zone can fix it: {outcome.code}: "
                   f"{outcome.message}", job_id=o.job_id)
    if not f.record:
        return
    after, committed, current = _record_outcome(deps, o.job_id, a, outcome)
    if committed and after.alert is not None:
        deps.publish(after.alert)
    if after.action.kind is Act.DELETE:
        logs.warning(f"{a.node} in {a.zone} was created for a placement the job has left ({current.node} in "
                     f"{current.zone}); deleting it", job_id=o.job_id)
        provider.delete(after.action.zone, after.action.node)


def _perform(deps: Deps, o: Observation, spec: JobSpec | None, a: Action | job.SetGeneration | job.DeleteNodes,
             provider: NodeProvider) -> outcomes.Outcome:
    """The provider call of a create, start or delete; raises what the provider raised."""
    if a.kind is Act.DELETE:
        provider.delete(a.zone, a.node)
        logs.info(f"deleted {a.node} in {a.zone}", job_id=o.job_id, node=a.node, zone=a.zone)
        return outcomes.DONE
    if isinstance(a, job.DeleteNodes):  # every node the job leaves at once (a failure re-raises after the others ended)
        with ThreadPoolExecutor(len(a.targets)) as pool:
            list(pool.map(lambda t: provider.delete(t[1], t[2]), a.targets))
        logs.info(f"deleted {', '.join(t[2] for t in a.targets)}", job_id=o.job_id, nodes=[t[2] for t in a.targets])
        return outcomes.DONE
    if isinstance(a, job.SetGeneration):  # every member behind at once (a failure re-raises after the others ended)
        with ThreadPoolExecutor(len(a.targets)) as pool:
            list(pool.map(lambda t: provider.set_attributes(t[1], t[2], {contract.ATTR_GENERATION: a.value}),
                          a.targets))
        logs.info(f"gave {', '.join(t[2] for t in a.targets)} generation {a.value}", job_id=o.job_id)
        return outcomes.DONE
    assert spec is not None  # decide only creates or starts for a valid spec
    if a.kind is Act.CREATE:
        identity = identities.identity_for(o.job_id, spec, deps.identities, deps.store, deps.grants,  # type: ignore[arg-type]
                                           lambda doc: _nodes_left(deps, doc))
        created = provider.create(spec, a.zone, a.node, a.attempt, a.provisioning, deps.startup_script(),
                                  slot=a.slot or 0, service_account=identity, handover=a.handover)
        logs.info(f"{'created' if created else 'adopted existing'} {a.node} in {a.zone} ({a.provisioning})",
                  job_id=o.job_id, node=a.node, zone=a.zone, attempt=a.attempt)
        return outcomes.DONE if created else outcomes.EXISTS
    provider.start(a.zone, a.node)
    logs.info(f"started {a.node} in place in {a.zone}", job_id=o.job_id, node=a.node, zone=a.zone)
    return outcomes.DONE


def _nodes_left(deps: Deps, doc: dict[str, Any] | None) -> bool:
    """Whether any node a (finished) job's document names still exists: its identity is not free until none is."""
    kind = ((doc or {}).get("spec") or {}).get("accelerator", {}).get("kind", "gpu")
    # A TPU job's node may have come from a queued resource (it holds quota until deleted), or not.
    providers = [deps.providers.get(k) for k in ((kind, queued.PROVIDER) if kind == "tpu" else (kind,))]
    return any(p is None or any(p.get(zone, node) is not None for zone, node in identities.known_nodes(doc))
               for p in providers)


def _record_outcome(deps: Deps, job_id: str, a: Action | job.SetGeneration, outcome: outcomes.Outcome
                    ) -> tuple[Decision, bool, JobStatus]:
    """Commit outcomes.after_act() on the job's current status: (that decision, whether it was committed, the status
    read last). A conflicting write in between: read and decide again (the next pass does, after 5)."""
    after, current = Decision(NONE), JobStatus()
    for _ in range(5):
        found = deps.store.job(job_id)
        if found is None:
            return Decision(NONE), False, JobStatus()
        doc, version = found
        current = JobStatus.model_validate(doc.get("status") or {})
        after = job.after_act(job_id, current, a, outcome, deps.now())
        if after.status is None:
            return after, False, current
        event = JobEvent.new(current.state, after.status.state, after.cause, **after.details) if after.cause else None
        if _commit(deps, job_id, version, after.status, event):
            return after, True, current
    return after, False, current  # still contended: the next pass observes and decides afresh
