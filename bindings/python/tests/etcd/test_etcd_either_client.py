"""The etcd executor in both clients on a real 3-member cluster: ``EtcdExecutor`` in
``AsyncLockClient`` runs its calls in worker threads (watch streams reach the loop);
``AsyncEtcdExecutor`` in ``LockClient`` is refused with an error naming ``EtcdExecutor``."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from either_client import in_both_clients, refused_by_lock_client  # noqa: E402

from leasehold.backends.etcd_executor import AsyncEtcdExecutor, EtcdExecutor  # noqa: E402


def test_etcd_executor_in_both_clients(etcd_cluster: Any) -> None:
    in_both_clients(lambda: EtcdExecutor(etcd_cluster.urls), "either")


def test_async_etcd_executor_is_refused_by_lock_client(etcd_cluster: Any) -> None:
    refused_by_lock_client(AsyncEtcdExecutor(etcd_cluster.urls), "leasehold.backends.etcd_executor.EtcdExecutor")
