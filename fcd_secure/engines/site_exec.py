"""The site's own SuperExec: only the consortium's pinned app ever runs on a site (docs/threats.md P27).

Open-source Flower (the pinned version, :data:`fcd_secure._flower.pins.FLWR_VERSION`) lets anyone who reaches the
SuperLink submit an app (``flwr run``; the Control API is unauthenticated), and a SuperNode then runs that app's
ClientApp code. Its FAB verification (``--trusted-entities``) accepts only FABs signed through Flower Hub (the
pinned Flower's ``flwr-supernode --trusted-entities``). So the site takes the launch itself:

* the SuperNode runs with ``--isolation process`` (it launches nothing) and ``--superexec-auth-secret-file``, so
  only a process holding the site's secret can acquire its tasks on the SuperNode's Runtime API (the pinned
  Flower's ``Runtime/AcquireTask`` under ``SuperExecAuthHttpInterceptor``);
* :func:`serve` is that process (``python -m fcd_secure.engines.site_exec serve``): it acquires each ClientApp
  task and starts :func:`run_task` for it in a fresh process, as Flower's own SuperExec does;
* :func:`run_task` pulls the task's message, context and FAB from the SuperNode and computes SHA-256 of the FAB's
  bytes itself. Only if the hash is pinned in the site's policy (``[app] fab_sha256``) does it run the site's
  *installed* ClientApp (``fcd_secure.apps.client_app.app``); the FAB is never installed and no code from it
  is ever imported. Otherwise it records a refusal (rule ``app_not_pinned``) in the site ledger, logs it, and
  answers with the policy error;
* the app alone does not say who started the run, or with what run config (anyone who reaches the Control API can
  submit the pinned app with a config of their own): the run config must carry the coordinator's signature over the
  consortium id, the app hash, a fresh session id and the exact run config (``federation.run_ticket``), checked
  against the coordinator key and consortium the site pinned at join (``[app] coordinator_key``,
  ``consortium_id``). A run that fails it is refused the same way (rule ``run_not_signed``, docs/threats.md P34);
* a signed run start is used once: the site keeps the run starts it accepted (session id -> Flower run id,
  ``federation.run_ticket.AcceptedRuns`` in its state folder) and refuses one resubmitted under another run id, or
  first seen after its expiry (rule ``run_replayed``, docs/threats.md P52).

This is the narrowest seam that the site controls: Flower's own task plumbing (messages, context, heartbeats) is
used unchanged, and the decision is taken on the bytes the site received, before anything from them runs. It can
also host a warm per-site process (run :func:`run_task` in the serving process instead of a fresh one) without
changing the check.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from fcd_secure._flower.wake import FALLBACK_POLL_S, WakeReader

log = logging.getLogger("fcd_secure.site_exec")

#: the SuperNode Runtime API method only the site's secret may call
ACQUIRE_METHOD = "/flwr.proto.Runtime/AcquireTask"
#: the task token reaches the task process through the environment, never its command line (``ps`` shows that)
TOKEN_ENV = "FCD_TASK_TOKEN"
POLL_S = float(os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1"))


def fab_digest(content: bytes) -> str:
    """SHA-256 (hex) of a FAB's bytes, as ``flwr build`` names it."""
    return hashlib.sha256(content).hexdigest()


def task_refusal(policy, digest: str, run_config: dict, *, accepted=None, run_id: int = 0):  # noqa: ANN001, ANN201
    """Why the site refuses a task of the app with FAB hash ``digest`` and this run config, or ``(None, "")``.

    The app must be pinned (``[app] fab_sha256``, P27), and the run signed by the coordinator the site pinned, for
    the site's consortium, this app and exactly this run config (``federation.run_ticket``, P34). With ``accepted``
    (the site's ``federation.run_ticket.AcceptedRuns``) the signed run start must also be new or already this
    Flower run ``run_id``'s, and unexpired when first seen (P52).

    Args:
        policy: the site's ``SitePolicy``.
        digest: SHA-256 of the FAB the site received.
        run_config: the run's ``Context.run_config``.
        accepted: the record of the run starts the site accepted (``None``: single use not checked).
        run_id: the task's Flower run id (``Context.run_id``).

    Returns:
        ``(Refusal, why)`` or ``(None, "")``.
    """
    from fcd_secure.audit import Refusal  # noqa: PLC0415
    from fcd_secure.federation.run_ticket import RunTicketError, verify_run_ticket  # noqa: PLC0415

    if digest not in policy.app.fab_sha256:
        return Refusal("app_not_pinned", "fab", digest[:16]), "its hash is not pinned in the site policy"
    try:
        if policy.app.coordinator_key is None:
            raise RunTicketError("the site policy pins no coordinator key ([app] coordinator_key)")
        ticket = verify_run_ticket(run_config, coordinator_public_key=policy.app.coordinator_key,
                                   consortium_id=policy.app.consortium_id, fab_sha256=digest)
    except RunTicketError as exc:
        return Refusal("run_not_signed", "run_config", digest[:16]), f"the run is not signed: {exc}"
    if accepted is not None:
        try:
            accepted.accept(ticket, run_id)
        except RunTicketError as exc:
            return Refusal("run_replayed", "run_config", ticket.session_id[:16]), f"the run start is not new: {exc}"
    return None, ""


def run_task(address: str, token: str) -> int:
    """Run one ClientApp task of the SuperNode at ``address``, or refuse it (module docstring).

    Returns:
        0 when the task ran, 3 when the app was refused, 1 on a failure (the SuperNode sees the task fail).
    """
    from flwr.app import Error, Message  # noqa: PLC0415

    from fcd_secure._flower.superexec import (  # noqa: PLC0415 - Flower's task plumbing, pinned (_flower.pins)
        HeartbeatSender,
        RuntimeTokenHttpInterceptor,
        SubStatus,
        make_task_heartbeat_fn_http,
        pull_task_input,
        push_message,
        push_task_output,
        runtime_client,
    )

    from fcd_secure.audit import GENERIC_ERROR_REASON, GATE_ERROR_CODE, SiteLedger, record_site_refusal  # noqa: PLC0415
    from fcd_secure.audit.ledger import SITE_LEDGER_FILE  # noqa: PLC0415
    from fcd_secure.federation.site_policy import load_site_policy  # noqa: PLC0415
    from fcd_secure.federation.run_ticket import AcceptedRuns  # noqa: PLC0415
    from fcd_secure.federation.state import SiteState  # noqa: PLC0415
    from fcd_secure.privacy.anchor import read_anchors  # noqa: PLC0415
    from fcd_secure.privacy.ledger import privacy_ledger_hash  # noqa: PLC0415

    t_start = time.perf_counter()
    t_pulled = t_ran = None
    client = runtime_client(address, [RuntimeTokenHttpInterceptor(token)])
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    message = context = reply = None
    status, details, code = SubStatus.FAILED, "task failed on the site", 1
    try:
        message, context, _run, fab = pull_task_input(client)
        t_pulled = time.perf_counter()
        nc = dict(context.node_config)
        site_id, state_root = str(nc["site-id"]), str(nc["state-dir"])
        policy = load_site_policy(nc, state_root, site_id)
        digest = fab_digest(fab.content)
        state = SiteState(state_root, site_id)
        refusal, why = task_refusal(policy, digest, dict(context.run_config), accepted=AcceptedRuns(state.dir),
                                    run_id=int(context.run_id))
        if refusal is not None:
            ledger = SiteLedger(state.slot(SITE_LEDGER_FILE), state.identity_private_key(), writer_id=site_id)
            reply = record_site_refusal(
                ledger, message, refusal,
                privacy_ledger_hash=privacy_ledger_hash(state.dir, policy.dp.ledger_dir),
                privacy_anchors=read_anchors(state.dir),
            )
            log.warning("site %s refused app %s (run %d): %s; nothing ran", site_id, digest, context.run_id, why)
            status, details, code = SubStatus.COMPLETED, f"refused by the site ({refusal.rule})", 3
        else:
            from fcd_secure.apps.client_app import app  # noqa: PLC0415 - the site's installed app, never the FAB's

            reply = app(message=message, context=context)
            t_ran = time.perf_counter()
            status, details, code = SubStatus.COMPLETED, "", 0
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no exception text leaves the site
        log.error("site task failed: %s", type(exc).__name__)
        if message is not None:
            # the SuperNode waits for a reply to every message it handed out; this one carries nothing
            reply = Message(Error(code=GATE_ERROR_CODE, reason=GENERIC_ERROR_REASON), reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
        finally:
            push_task_output(client, context, status, details)
            heartbeat.stop()
            client.close()
            # where a message's time goes on the site (benchmarks/federation.py reads these lines)
            t_end = time.perf_counter()
            log.info("task %s: pull %.3f s, run %.3f s, push %.3f s",
                     message.metadata.message_type if message is not None else "?",
                     (t_pulled or t_end) - t_start, (t_ran - t_pulled) if t_ran and t_pulled else 0.0,
                     t_end - (t_ran or t_pulled or t_start))
    return code


def serve(address: str, secret_file: str, parent_pid: int | None = None, warm: bool = False,
          wake_pipe: str | None = None) -> None:
    """Acquire the SuperNode's ClientApp tasks with the site's secret and run each in a fresh process, or, with
    ``warm``, in this process (:func:`run_task` unchanged: the app hash is checked on every task's FAB).

    Warm mode imports torch once and keeps the site's data, model code and caches between messages, where a fresh
    process per message pays the imports and the data loading each time (2.5 s + 2.8 s on this machine,
    measured with the per-task timings below). What it gives up is the process boundary *between two tasks of the
    same site*: state left in memory by one message (the learner's data cache) is seen by the next. Nothing of
    another site or of the submitted FAB ever runs here, so the site's isolation from the server and from other
    sites is the same; the tasks run one at a time.

    The executor also keeps each acquired task's heartbeat going until its process exits: a task token lapses when no
    heartbeat arrives for two heartbeat intervals (the pinned Flower), and a cold process on a loaded machine can take that
    long to import before its own heartbeat starts.

    With ``wake_pipe`` the executor asks for a task when the SuperNode wakes it through that pipe and otherwise
    only every ``_flower.wake.FALLBACK_POLL_S``; without it, every :data:`POLL_S`, as Flower's SuperExec does.
    """
    from fcd_secure._flower.superexec import (  # noqa: PLC0415 - Flower's task plumbing, pinned (_flower.pins)
        AcquireTaskRequest,
        HeartbeatSender,
        RuntimeTokenHttpInterceptor,
        SuperExecAuthHttpInterceptor,
        TaskType,
        quiet_heartbeat,
        runtime_client,
        start_parent_process_monitor,
    )

    secret = Path(secret_file).read_bytes()
    if not secret:
        raise SystemExit(f"{secret_file}: the SuperExec secret is empty")
    if parent_pid is not None:
        start_parent_process_monitor(parent_pid)
    client = runtime_client(
        address, [SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=frozenset({ACQUIRE_METHOD}))]
    )
    children: list[tuple[subprocess.Popen, HeartbeatSender, object]] = []
    if warm:  # the point of a warm executor: torch, the model code and the app load once, before the first task
        from fcd_secure.apps import client_app  # noqa: F401, PLC0415
        from fcd_secure.federation import site_policy  # noqa: F401, PLC0415
        from fcd_secure.privacy import ledger  # noqa: F401, PLC0415
    reader = None
    if wake_pipe:
        reader = WakeReader(wake_pipe)
    log.info("site executor acquiring tasks at %s%s%s", address, " (warm)" if warm else "",
             f", woken through {wake_pipe}" if wake_pipe else "")
    while True:
        running = []
        for proc, beat, task_client in children:  # reap finished tasks
            if proc.poll() is None:
                running.append((proc, beat, task_client))
            else:
                beat.stop()
                task_client.close()
        children = running
        res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
        if res.HasField("task") and res.token:
            task_client = runtime_client(address, [RuntimeTokenHttpInterceptor(res.token)], retry=False)
            beat = HeartbeatSender(quiet_heartbeat(task_client))
            beat.start()
            if warm:
                try:
                    run_task(address, res.token)
                except Exception as exc:  # noqa: BLE001 - one task's failure must not stop the site's executor
                    log.error("site task failed in the warm executor: %s", type(exc).__name__)
                finally:
                    beat.stop()
                    task_client.close()
            else:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "fcd_secure.engines.site_exec", "task", "--runtime-api-address", address],
                    env=dict(os.environ, **{TOKEN_ENV: res.token}),
                )
                children.append((proc, beat, task_client))
            continue  # the next message may be stored already
        if reader is not None:
            reader.wait(FALLBACK_POLL_S)
        else:
            time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fcd_secure.engines.site_exec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_serve = sub.add_parser("serve", help="acquire and run the SuperNode's ClientApp tasks")
    p_serve.add_argument("--runtime-api-address", required=True)
    p_serve.add_argument("--secret-file", required=True)
    p_serve.add_argument("--parent-pid", type=int, default=None)
    p_serve.add_argument("--warm", action="store_true", help="run the tasks in this process (one warm ClientApp)")
    p_serve.add_argument("--wake-pipe", default=None,
                         help="a named pipe the SuperNode writes to when a message arrives (_flower.wake)")
    p_task = sub.add_parser("task", help="run one task (token in $FCD_TASK_TOKEN)")
    p_task.add_argument("--runtime-api-address", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise
    if args.cmd == "serve":
        serve(args.runtime_api_address, args.secret_file, args.parent_pid, warm=args.warm, wake_pipe=args.wake_pipe)
        return 0
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        parser.error(f"no task token in ${TOKEN_ENV}")
    return run_task(args.runtime_api_address, token)


if __name__ == "__main__":  # pragma: no cover - process entry point
    sys.exit(main())
