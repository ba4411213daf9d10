"""The core worker's way back to a GCS that restarted on durable storage (Redis): when
the GCS connection drops, ``CoreWorker._gcs_lost`` spawns ``reconnect``, which reaches the
new GCS with backoff within ``gcs_reconnect_timeout_s``, registers the driver's job again,
renews its subscriptions, sends the notifications held back meanwhile, and has actor
subscriptions renewed; past the deadline the cluster is reported gone. GCS calls made
meanwhile wait in ``CoreWorker._gcs_call``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

from lumos._private.core_worker.tasks import DRIVER
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import ConnectionLost, RemoteError, connect_with_retry

if TYPE_CHECKING:
    from lumos._private.core_worker.core_worker import CoreWorker

logger = logging.getLogger(__name__)


async def reconnect(cw: CoreWorker) -> None:
    """Reach the restarted GCS (durable storage) with backoff, within gcs_reconnect_timeout_s."""
    cfg = cw.config
    deadline = time.monotonic() + cfg.gcs_reconnect_timeout_s
    delay = 0.1
    try:
        while not cw._closed:
            try:
                gcs = await connect_with_retry(cw.gcs_address, token=cw.token, config=cfg,
                                               handlers={m.Publish: cw._handle_publish},
                                               name="core-worker->gcs", on_close=cw._gcs_lost,
                                               timeout_s=max(0.1, deadline - time.monotonic()))
                if cw.mode == DRIVER:
                    await gcs.call(m.RegisterJob(cw.address, os.getpid(), cw.namespace, cw.entrypoint,
                                                 cw.job_id, cw.job_metadata), cfg.rpc_timeout_s)
                    gcs.notify(m.Subscribe("logs", cw.job_id))
                    gcs.notify(m.Subscribe("errors", cw.job_id))
                if cw.follows_deaths:
                    gcs.notify(m.Subscribe("worker_deaths", None))
                gcs.notify(m.Subscribe("nodes", None))
                cw.gcs = gcs
                for msg in cw._gcs_backlog:
                    gcs.notify(msg)
                cw._gcs_backlog = []
                cw._metrics_held = 0
                for q in list(cw.actor_submitter.actors.values()):
                    if q.subscribed:
                        q.subscribed = False
                        cw.actor_submitter.track(q.actor_id)
                logger.info("reconnected to the GCS")
                return
            except (ConnectionLost, OSError, TimeoutError, RemoteError) as e:
                why = f"{type(e).__name__}: {e}"
            if time.monotonic() + delay > deadline:
                logger.error("could not reach the GCS again within gcs_reconnect_timeout_s=%.0fs (%s)",
                             cfg.gcs_reconnect_timeout_s, why)
                cw._cluster_gone(f"the GCS went away and was not back within gcs_reconnect_timeout_s="
                               f"{cfg.gcs_reconnect_timeout_s:.0f}s")
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
    finally:
        cw._gcs_reconnecting = False
