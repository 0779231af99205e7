"""Elastic HSDP: replicas are the unit of failure; survivors carry on, replacements heal in.

The job's ``W`` ranks form ``W // shard_size`` replicas of ``shard_size`` ranks (job rank ``g``
is shard ``g % shard_size`` of replica ``g // shard_size``). Inside a replica the parameters are
sharded by ``fsdp2.fully_shard`` on the replica's *shard* communicator; after each backward the
gradient shards are summed across the live replicas on the *replicate* communicator of its
shard index, and a *world* communicator over every live rank carries the step's report and the
agreement.

    el = ElasticHSDP(shard_size=2)
    for block in model.blocks:
        el.fully_shard(block)
    el.fully_shard(model)
    opt = torch.optim.AdamW(model.parameters())
    if el.start(model, opt):                       # forms the job, or heals into it
        while el.step < steps:
            res = el.train_batch(mean_loss_of, global_batch)   # mean_loss_of(sample indices) -> loss
    el.finish()

A step is applied only if ``world.agree(ok)`` says every live rank's collectives succeeded, so
no survivor applies a step another did not. Otherwise the survivors shrink the world, keep the
replicas that still have all their ranks and re-form the world and replicate communicators over
them (``reconfigure``). :meth:`ElasticHSDP.train_batch` then keeps the gradients the survivors
computed and runs a make-up pass over only the samples of the lost replicas, split over the
remaining ranks, and applies the step: no sample lost or repeated, and the survivors spend no
compute twice. (:meth:`ElasticHSDP.train_step`, for callers that split the data themselves,
returns the step unapplied and the caller redoes it with the whole global batch.) A rank whose
replica lost a member raises :class:`ReplicaLostError` (its process should exit;
``torchcomms-run --on-failure shrink --max-restarts N`` starts it again). A restarted replica
forms its shard communicator, says it is ready in the job's store, and is admitted by the live
ranks at the next step boundary: the communicators are re-formed with it and a live replica
sends it the parameters and optimizer state (point to point on the replicate communicator, no
file system).
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch import nn

import torchcomms
from torchcomms.setup.bootstrap import discover_rank_size
from fsdp2.api import fully_shard as _fully_shard
from fsdp2.api import release_comms
from fsdp2.collectives import FSDPCommError
from fsdp2.elastic_batch import StepLedger, split_in_order
from fsdp2.elastic_grads import check_max_norm, clip_to, copy_flat, total_norm
from fsdp2.elastic_state import check_scheduler, local_shard, receive_state, send_state, state_meta
from fsdp2.groups import FSDPComms

__all__ = ["ElasticHSDP", "ReplicaLostError", "StepResult"]

_POLL_S = 0.005  # a replica all-reduce's checks for a failure of the world
_KEY_POLL_S = 0.02  # store keys (configurations, admissions)


class ReplicaLostError(FSDPCommError):
    """This rank's replica lost a member: the rank has left the job (its communicators are
    aborted); its process should exit so that the launcher can start the replica again."""


@dataclass(frozen=True)
class StepResult:
    """What :meth:`ElasticHSDP.train_batch` or :meth:`~ElasticHSDP.train_step` did: ``applied``
    (the optimizer stepped; ``step`` is then the number of the step applied) or not (only
    ``train_step``: the survivors re-formed; ``step`` is the step to redo), the step's loss
    (``None`` when not applied), the live replicas afterwards and what changed (``"shrunk"``,
    ``"healed"``, ``"heal failed"`` or ``None``). ``passes``: the wall-clock (``time.time()``)
    start and end of each forward + backward this rank ran for the step (``train_batch``: more
    than one after a failure, the make-up passes); ``recovery_s``: the time the step spent
    recovering (shrink, re-forming), 0.0 without a failure; ``grad_norm``: with ``max_grad_norm``,
    the total norm of the step's gradient before clipping (as ``clip_grad_norm_`` returns it)."""

    applied: bool
    step: int
    loss: float | None
    replicas: tuple[int, ...]
    event: str | None = None
    passes: tuple[tuple[float, float], ...] = ()
    recovery_s: float = 0.0
    grad_norm: float | None = None


def _job_world() -> int:
    """The job's world size, found as ``new_comm`` finds it (``torchcomms-run``, torchrun, MPI...)."""
    _rank, size, source = discover_rank_size()
    if source == "default":
        raise FSDPCommError("the job's world size is unknown: set TORCHCOMM_SIZE or WORLD_SIZE (torchcomms-run does)")
    return size


class ElasticHSDP:
    """Elastic HSDP over replicas of ``shard_size`` ranks (see the module docstring).

    ``store``: the job's store (default ``torchcomms.job_store()``, the control plane's under
    ``torchcomms-run``, which outlives every worker). ``timeout``: of every communicator and
    of each wait in forming, healing and recovery. ``join_timeout``: how long a replacement
    waits to be admitted.
    """

    def __init__(self, shard_size: int, *, name: str = "elastic", backend: str = "gloo",
                 device: torch.device | str = "cpu", store: Any = None,
                 timeout: timedelta = timedelta(seconds=60), join_timeout: timedelta = timedelta(seconds=600)) -> None:
        world = _job_world()
        if not isinstance(shard_size, int) or shard_size < 1 or world % shard_size:
            raise FSDPCommError(f"shard_size must be a positive divisor of the world size {world}, got {shard_size!r}")
        self.timeout, self.join_timeout = timeout, join_timeout
        self.store = store if store is not None else torchcomms.job_store(timeout)

        def comm(kind: str) -> Any:
            return torchcomms.new_comm(backend, device, f"{name}.{kind}", abort_process_on_timeout_or_error=False,
                                       timeout=timeout, enable_reconfigure=True, hints={"deferred_init": "true"})

        self.shard, self.world, self.replicate = comm("shard"), comm("world"), comm("replicate")
        self.rank = self.world.get_global_ranks()[0]
        self.shard_size, self.n_replicas = shard_size, world // shard_size
        self.replica, self.shard_index = divmod(self.rank, shard_size)
        self.ns = f"fsdp2.elastic/{name}"
        self.incarnation = int(self.store.add(f"{self.ns}/starts/{self.rank}", 1))
        self.step = 0
        self.cfg = -1
        self.live: list[int] = []
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        #: a healed rank's timings (seconds): ready -> admitted, re-forming, receiving the state
        self.heal_times: dict[str, float] = {}
        self.recovery_s = 0.0  #: how long the last recovery took (shrink, re-forming)
        self.comms = self._form_shard()

    # --- forming ---------------------------------------------------------------------------
    def _wait_keys(self, keys: list[str], limit: timedelta | None = None) -> None:
        """Wait until every key is set; ``CommTimeoutError`` (a failed configuration, handled
        like any other) after ``limit`` (default: the timeout) when a rank never wrote its key."""
        secs = (limit or self.timeout).total_seconds()
        deadline = time.monotonic() + secs
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                missing = [k for k in keys if not self.store.check([k])]
                raise torchcomms.CommTimeoutError(f"fsdp2.elastic: {missing} not written within {secs:g} s",
                                                  timeout_s=secs, comm=self.world.get_name(), op="configure")
            time.sleep(_KEY_POLL_S)

    def _form_shard(self) -> FSDPComms:
        """The replica's shard communicator (its ranks of this incarnation) and FSDP's mesh."""
        from torchcomms.device_mesh import init_device_mesh

        base = f"{self.ns}/shard/{self.replica}/i{self.incarnation}"
        self.store.set(f"{base}/{self.shard_index}", self.shard.get_init_handle())
        keys = [f"{base}/{j}" for j in range(self.shard_size)]
        self._wait_keys(keys, self.join_timeout)
        self.shard.reconfigure(f"r{self.replica}i{self.incarnation}",
                               [self.store.get(k).decode() for k in keys]).wait()
        mesh = init_device_mesh((self.shard,), ("shard",), _global_comm=self.shard)
        return FSDPComms(self.shard, 1, self.shard_size, self.shard, self.shard, None, mesh, mesh, False)

    def fully_shard(self, module: nn.Module, **kwargs: Any) -> nn.Module:
        """``fsdp2.fully_shard`` of ``module`` over this rank's replica (its layout fixed:
        ``overlap`` and ``replicate_size`` are not arguments here)."""
        fixed = sorted({"overlap", "replicate_size"} & kwargs.keys())
        if fixed:
            raise FSDPCommError(f"ElasticHSDP.fully_shard sets {' and '.join(fixed)} itself (the replica's layout); "
                                "pass only the other arguments of fsdp2.fully_shard")
        return _fully_shard(module, self.comms, overlap=False, **kwargs)

    def members(self, replicas: list[int] | None = None) -> list[int]:
        """The job ranks of ``replicas`` (default: the live ones), in order."""
        s = self.shard_size
        return [r * s + j for r in (self.live if replicas is None else replicas) for j in range(s)]

    def _reform(self, cfg: int, live: list[int]) -> None:
        """Re-form the world and replicate communicators over the ranks of ``live`` (configuration
        ``cfg``: every rank taking part holds it from now on, also when this fails)."""
        self.cfg = cfg
        base = f"{self.ns}/cfg{cfg}"
        self.store.set(f"{base}/world/{self.rank}", self.world.get_init_handle())
        self.store.set(f"{base}/rep/{self.rank}", self.replicate.get_init_handle())
        world_keys = [f"{base}/world/{g}" for g in self.members(live)]
        rep_keys = [f"{base}/rep/{r * self.shard_size + self.shard_index}" for r in live]
        self._wait_keys(world_keys + rep_keys)
        works = [self.world.reconfigure(f"cfg{cfg}", [self.store.get(k).decode() for k in world_keys]),
                 self.replicate.reconfigure(f"cfg{cfg}", [self.store.get(k).decode() for k in rep_keys])]
        for w in works:
            w.wait()
        self.cfg, self.live = cfg, list(live)

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, *,
              warm_up: Callable[[], torch.Tensor] | None = None, scheduler: Any = None) -> bool:
        """Join the job with ``model`` (sharded by :meth:`fully_shard`) and ``optimizer``: the
        first start of every rank forms the job (replica 0's parameters are broadcast to the
        others); a later start waits to be admitted at a step boundary and receives the
        state. Returns ``False`` when the job ended before this replica was admitted.

        ``warm_up``: a forward on any sample, returning a loss (e.g. ``lambda: loss_of([0])``).
        A replacement back-propagates it once and drops the gradients before it says it is
        ready, so that the live replicas do not wait for its first, slower iteration (lazy
        initialisation, first-touch allocations) in the step that admits it.

        ``scheduler``: the optimizer's LR scheduler (anything with ``step()`` and a JSON-able
        ``state_dict()`` / ``load_state_dict()``). Each applied step steps it right after the
        optimizer (the caller does not), and a replacement receives its state with the
        optimizer's, so that every replica applies the same learning rate."""
        check_scheduler(scheduler)
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        if self.incarnation == 1:  # every rank's first process: the job's start
            self._reform(0, list(range(self.n_replicas)))
            with torch.no_grad():
                for p in self._params():
                    self.replicate.broadcast(local_shard(p), 0, async_op=False)
            return True
        if warm_up is not None:
            try:
                warm_up().backward()
            except torchcomms.CommError as e:  # a rank of this replica failed again
                self.leave()
                raise ReplicaLostError(f"replica {self.replica} lost a rank while warming up ({e}); "
                                       f"rank {self.rank} left the job") from e
            optimizer.zero_grad(set_to_none=True)
        return self._join()

    # --- healing ---------------------------------------------------------------------------
    def _join(self) -> bool:
        ready = f"{self.ns}/ready/{self.rank}"
        admit = f"{self.ns}/admit/{self.replica}/i{self.incarnation}"
        self.store.set(ready, str(self.incarnation).encode())
        t0 = time.monotonic()
        deadline = time.monotonic() + self.join_timeout.total_seconds()
        everyone = [f"{self.ns}/ready/{g}" for g in range(self.n_replicas * self.shard_size)]
        while not self.store.check([admit]):
            if self.store.check([f"{self.ns}/done"]):
                self.store.delete_key(ready)
                return False
            if self.store.check(everyone):  # (live ranks never say ready): nobody can send the state;
                raise FSDPCommError(f"every rank of the job is waiting to join: no replica is live to send the "
                                    f"training state, which is lost (restart the job from a checkpoint); "
                                    f"rank {self.rank} gives up")  # (its key stays: the others give up too)
            if time.monotonic() > deadline:
                raise FSDPCommError(f"replica {self.replica} was not admitted within {self.join_timeout}")
            time.sleep(_KEY_POLL_S)
        rec = json.loads(self.store.get(admit))
        t1 = t2 = time.monotonic()
        self.store.delete_key(ready)
        assert self.optimizer is not None
        error: BaseException | None = None
        try:
            self._reform(int(rec["cfg"]), [int(r) for r in rec["live"]])
            self.step = int(rec["step"])
            t2 = time.monotonic()
            meta = json.loads(self.store.get(f"{self.ns}/cfg{rec['cfg']}/state/{self.shard_index}"))
            receive_state(self.replicate, self.live.index(int(rec["source"])), self._params(), self.optimizer, meta,
                          self.scheduler)
        except (torchcomms.CommError, ValueError) as e:  # (ValueError: a state layout this rank cannot take)
            error = e
        if not self.world.agree(error is None):  # the live ranks put their side of the heal to it too
            self._shrink_world()  # (they shrink: check in, then leave)
            self.leave()
            why = error if error is not None else "on another rank"
            raise ReplicaLostError(f"healing replica {self.replica} at step {rec['step']} failed ({why}); "
                                   f"rank {self.rank} left the job")
        self.heal_times = {"wait_admit_s": t1 - t0, "reform_s": t2 - t1, "state_s": time.monotonic() - t2}
        return True

    def _ready(self, replica: int) -> float:
        """1.0 when every rank of ``replica`` has said it is ready, in one incarnation."""
        keys = [f"{self.ns}/ready/{g}" for g in self.members([replica])]
        if not self.store.check(keys):
            return 0.0
        return 1.0 if len({self.store.get(k) for k in keys}) == 1 else 0.0

    def _heal(self, joining: list[int]) -> None:
        """Admit the replicas ``joining`` (every live rank calls it at the same step boundary)."""
        cfg, live, source = self.cfg + 1, sorted(self.live + joining), self.live[0]
        if self.rank == self.members()[0]:
            for r in joining:
                inc = self.store.get(f"{self.ns}/ready/{r * self.shard_size}").decode()
                self.store.set(f"{self.ns}/admit/{r}/i{inc}", json.dumps(
                    {"cfg": cfg, "live": live, "step": self.step, "source": source}).encode())
        if self.replica == source:
            assert self.optimizer is not None
            meta = state_meta(self._params(), self.optimizer, self.scheduler)
            self.store.set(f"{self.ns}/cfg{cfg}/state/{self.shard_index}", json.dumps(meta).encode())
        self._reform(cfg, live)
        if self.replica == source:
            assert self.optimizer is not None
            send_state(self.replicate, [live.index(r) for r in joining], self._params(), self.optimizer)

    # --- training --------------------------------------------------------------------------
    def _params(self) -> list[nn.Parameter]:
        assert self.model is not None, "call start() first"
        return list(self.model.parameters())

    def _grads(self) -> tuple[list[nn.Parameter], list[torch.Tensor]]:
        """The parameters that train (``requires_grad``) and the local shards of their gradients
        (for one that got none in this step, zeros that are not assigned to it)."""
        params = [p for p in self._params() if p.requires_grad]
        return params, [local_shard(p.grad) if p.grad is not None else torch.zeros_like(local_shard(p))
                        for p in params]

    def batch_indices(self, global_batch: int) -> range:
        """This rank's part of the step's global batch ``[step * B, (step + 1) * B)``, split
        in order over the live ranks (uneven parts differ by one sample at most)."""
        lo = self.step * global_batch
        part = split_in_order(range(lo, lo + global_batch), self.members())[self.rank]
        return range(part[0], part[-1] + 1) if part else range(lo, lo)

    def _broken(self) -> bool:
        return self.world.is_broken() or self.shard.is_broken()

    def _wait(self, work: Any) -> None:
        """Wait for ``work`` of the replicate communicator; a failure of any live rank (the
        world communicator breaks) revokes it, so no rank waits for a replica that left."""
        while not work.wait(_POLL_S):
            if self._broken():
                self.replicate.abort()
        work.wait()

    def _across_replicas(self, params: list[nn.Parameter], grads: list[torch.Tensor],
                         op: torchcomms.ReduceOp) -> torch.Tensor | None:
        """``grads`` (of ``params``) flattened into one buffer, then one flag per parameter (1: it
        has a gradient on this rank), reduced (``op``) across the live replicas; ``None`` when
        this replica is the only one (nothing to reduce)."""
        if len(self.live) == 1:
            return None
        flags = torch.tensor([float(p.grad is not None) for p in params],
                             dtype=grads[0].dtype if grads else torch.float32)
        flat = torch.cat([g.reshape(-1) for g in grads] + [flags])
        self._wait(self.replicate.all_reduce(flat, op, async_op=True))
        return flat

    def _report(self, loss_sum: float) -> torch.Tensor:
        """Summed over the live ranks: ``loss_sum``, and per replica not live, whether all its
        ranks are ready to heal in (``n`` live ranks each saying 1.0)."""
        report = torch.zeros(1 + self.n_replicas, dtype=torch.float64)
        report[0] = loss_sum
        for r in range(self.n_replicas):
            if r not in self.live:
                report[1 + r] = self._ready(r)
        self.world.all_reduce(report, torchcomms.ReduceOp.SUM, async_op=False)
        return report

    def train_batch(self, loss_of: Callable[[list[int]], torch.Tensor], global_batch: int, *,
                    max_grad_norm: float | None = None) -> StepResult:
        """Train step :attr:`step` on the samples ``[step * B, (step + 1) * B)`` of
        ``B = global_batch``, split in order over the live ranks. ``loss_of(indices)`` runs the
        forward on the listed samples and returns their mean loss; this method back-propagates it
        scaled so that the step's gradient is the mean over the global batch, sums the gradient
        shards across the live replicas and applies the optimizer when every live rank agrees
        the step succeeded.

        On a failure the survivors keep the gradients they computed: they shrink, re-form
        without the broken replicas and run a make-up pass over only the samples those replicas
        held, split over the remaining ranks, before the step is applied (so the step still
        averages the whole global batch; to rounding, the arithmetic of a job with fewer replicas
        from that step). A replica whose pass did not complete (an op timed out with every rank
        alive) drops its gradients and its samples are computed again. Raises
        :class:`ReplicaLostError` when this rank's replica left.

        ``max_grad_norm``: clip the step's gradient to that total 2-norm before the optimizer
        steps, as ``torch.nn.utils.clip_grad_norm_`` would (the norm is computed before the
        step is agreed on; ``StepResult.grad_norm`` is it).
        """
        opt = self.optimizer
        assert opt is not None, "call start() first"
        ledger = StepLedger(self.step, global_batch, self.shard_size)  # (checks global_batch)
        check_max_norm(max_grad_norm)
        loss_sum, recovery_s, event = 0.0, 0.0, None
        norm: torch.Tensor | None = None
        passes: list[tuple[float, float]] = []
        while True:
            error: BaseException | None = None
            computed = True  # this rank's passes of the step so far all completed
            try:
                if ledger.pending:
                    parts = ledger.assign(self.members())
                    together = ledger.replica_part(parts, self.replica)
                    if together:  # (a replica with nothing to compute skips the pass, all its ranks alike)
                        mine = parts[self.rank]
                        computed = False
                        t0 = time.time()
                        # a rank with no sample runs one at weight 0: its replica's collectives need it
                        loss = loss_of(mine or together[:1])
                        (loss * (len(mine) * self.shard_size / global_batch)).backward()
                        passes.append((t0, time.time()))
                        computed = True
                        loss_sum += float(loss.detach()) * len(mine)
                params, grads = self._grads()
                flat = self._across_replicas(params, grads, torchcomms.ReduceOp.SUM)
                if max_grad_norm is not None:
                    norm = total_norm(params, grads, flat)
                report = self._report(loss_sum)
            except torchcomms.CommError as e:
                error = e
            if self.world.agree(error is None):
                break
            t0 = time.monotonic()
            self._recover()
            incomplete = self._incomplete_replicas(computed)
            if self.replica in incomplete:
                opt.zero_grad(set_to_none=True)
                loss_sum = 0.0
            ledger.drop([r for r in list(ledger.done) if r not in self.live or r in incomplete])
            recovery_s += time.monotonic() - t0
            self.recovery_s = recovery_s
            event = "shrunk"
        if flat is not None:
            copy_flat(flat, params, grads)
        return self._apply(report, report[0].item() / global_batch, event, tuple(passes), recovery_s,
                           (max_grad_norm, norm))

    def _incomplete_replicas(self, computed: bool) -> set[int]:
        """The live replicas in which some rank's pass of the step did not complete (agreed
        over the re-formed world)."""
        flags = torch.zeros(self.n_replicas, dtype=torch.float64)
        flags[self.replica] = 0.0 if computed else 1.0
        self.world.all_reduce(flags, torchcomms.ReduceOp.SUM, async_op=False)
        return {r for r in self.live if flags[r].item() > 0}

    def train_step(self, forward_backward: Callable[[], torch.Tensor], *,
                   max_grad_norm: float | None = None) -> StepResult:
        """Run ``forward_backward()`` (returns the loss, gradients computed), average the
        gradients across the live replicas and apply the optimizer if every live rank agrees
        the step succeeded; else recover and return a result that is not applied: the caller
        redoes the step with the whole global batch (see the module docstring). For callers
        that split the data themselves; :meth:`train_batch` keeps the survivors' gradients and
        computes only the lost replicas' samples. Raises :class:`ReplicaLostError` when this
        rank's replica left. ``max_grad_norm``: as for :meth:`train_batch`."""
        opt = self.optimizer
        assert opt is not None, "call start() first"
        check_max_norm(max_grad_norm)
        norm: torch.Tensor | None = None
        error: BaseException | None = None
        passes: tuple[tuple[float, float], ...] = ()
        try:
            t0 = time.time()
            loss = forward_backward()
            passes = ((t0, time.time()),)
            params, grads = self._grads()
            flat = self._across_replicas(params, grads, torchcomms.ReduceOp.AVG)
            if max_grad_norm is not None:
                norm = total_norm(params, grads, flat)
            if flat is not None:
                copy_flat(flat, params, grads)
            report = self._report(float(loss.detach()))
        except torchcomms.CommError as e:
            error = e
        if not self.world.agree(error is None):
            opt.zero_grad(set_to_none=True)
            t0 = time.monotonic()
            self._recover()
            self.recovery_s = time.monotonic() - t0
            return StepResult(False, self.step, None, tuple(self.live), "shrunk", passes, self.recovery_s)
        return self._apply(report, report[0].item() / self.world.get_size(), None, passes, 0.0,
                           (max_grad_norm, norm))

    def _apply(self, report: torch.Tensor, loss: float, event: str | None, passes: tuple[tuple[float, float], ...],
               recovery_s: float, clip: tuple[float | None, torch.Tensor | None] = (None, None)) -> StepResult:
        """Clip the gradients (``clip``: the max norm and the step's total norm), step the
        optimizer (every live rank agreed), then admit the replicas ready to heal in."""
        opt = self.optimizer
        assert opt is not None
        max_norm, norm = clip
        if max_norm is not None and norm is not None:
            clip_to(self._params(), max_norm, norm)
        grad_norm = None if norm is None else float(norm)
        opt.step()
        if self.scheduler is not None:
            self.scheduler.step()
        opt.zero_grad(set_to_none=True)
        applied, self.step = self.step, self.step + 1
        n = self.world.get_size()
        joining = [r for r in range(self.n_replicas) if r not in self.live and report[1 + r].item() == n]
        if joining:
            before = list(self.live)
            healed = True
            try:
                self._heal(joining)
            except torchcomms.CommError:
                healed = False
            if not self.world.agree(healed):  # joiners and live ranks alike: the heal failed somewhere
                self.live = before
                self._recover()  # the joining replicas leave; the step applied stays applied
                return StepResult(True, applied, loss, tuple(self.live), "heal failed", passes, recovery_s, grad_norm)
            event = "healed"
        return StepResult(True, applied, loss, tuple(self.live), event, passes, recovery_s, grad_norm)

    def _shrink_world(self) -> None:
        """Shrink the world to the survivors and wait until every survivor has its engine: a
        rank that leaves next (its replica is broken) must not close its connections while
        another survivor is still connecting to it (its shrink then failed, and the job with it)."""
        self.world = self.world.shrink()
        self.world.agree(True)

    def _recover(self) -> None:
        """After a step that was not applied: agree on the survivors, keep the complete
        replicas, re-form over them."""
        self._shrink_world()
        survivors = set(self.world.get_global_ranks())
        live = [r for r in self.live if all(g in survivors for g in self.members([r]))]
        if self.replica not in live:
            self.leave()
            raise ReplicaLostError(f"replica {self.replica} lost a rank (survivors {sorted(survivors)}); "
                                   f"rank {self.rank} left the job at step {self.step}")
        self._reform(self.cfg + 1, live)

    # --- the end ---------------------------------------------------------------------------
    def leave(self) -> None:
        """Abort this rank's communicators (it takes no further part in the job)."""
        release_comms(self.comms, abort=True)
        for c in (self.world, self.replicate):
            c.abort()

    def finish(self) -> None:
        """Training is over: replacements still waiting to join give up; the communicators
        are finalized."""
        if self.live and self.rank == self.members()[0]:
            self.store.set(f"{self.ns}/done", b"1")
        for c in (self.world, self.replicate):
            c.finalize()
        release_comms(self.comms)
