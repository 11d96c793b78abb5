"""The data mesh: a 1-D ``('data',)`` mesh over devices, and one XLA:CPU device per core.

Batches are sharded with ``NamedSharding(mesh, P('data'))`` and parameters replicated; every
package that shards work over devices builds its mesh here."""

from __future__ import annotations

import os

import jax
import numpy as np


def use_one_cpu_device_per_core() -> bool:
    """Ask JAX for one XLA:CPU device per available core; call before JAX's first operation.

    Generation is elementwise over samples, and XLA:CPU's own threading leaves cores idle on
    the sampler's many small fusions; with one device per core the
    ``data_mesh`` gives each core its shard. Has no effect (returns False) when JAX's backend
    is already running, or when the device count is already set by ``jax_num_cpu_devices`` or
    ``XLA_FLAGS=--xla_force_host_platform_device_count``. Samples do not depend on it.
    """
    if ("xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
            or jax.config.jax_num_cpu_devices > 0):
        return False
    try:
        jax.config.update("jax_num_cpu_devices", len(os.sched_getaffinity(0)))
    except RuntimeError:  # the backend already exists; its device count is fixed
        return False
    return True


def data_mesh(devices=None) -> jax.sharding.Mesh:
    """A 1-D mesh named ('data',) over ``devices`` (default: all local devices)."""
    devices = jax.devices() if devices is None else devices
    return jax.sharding.Mesh(np.asarray(devices), ("data",))
