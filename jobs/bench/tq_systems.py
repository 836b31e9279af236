"""One TransferQueue per implementation for `bench verl`, as each trainer has its own.

verl's buffer lists *every* partition of its TransferQueue on each poll (`kv_list()` with no
partition), so in one TransferQueue shared by the benchmark's five implementations its calls
paid for the other four partitions' keys too (at 10,000 groups, 250,000 keys listed instead of
50,000). Here every implementation gets a TransferQueue of its own: a controller and one storage
unit on the benchmark's Ray cluster, and a client in this process.

TransferQueue 0.1.11 has one client per process (a module global of `transfer_queue.interface`,
which every module-level call such as `tq.kv_list` goes through) and names the actors `init`
starts, so it offers one system per process. A further system is built here as `init` builds the
first, with unnamed actors and a client of its own; `use` points the module-level calls at one
system's client (untimed, between calls). Its actors ask for no CPU of Ray's (they would
otherwise not fit the test session's cluster); they run on the same machine all the same.
"""
from __future__ import annotations

import os
from importlib import resources
from typing import Any
from uuid import uuid4


class System:
    """An extra TransferQueue: its controller, its storage unit and the client that reaches them."""

    def __init__(self, name: str) -> None:
        import ray
        from omegaconf import OmegaConf
        from transfer_queue.client import TransferQueueClient
        from transfer_queue.controller import TransferQueueController
        from transfer_queue.sampler import SequentialSampler
        from transfer_queue.storage.simple_storage import SimpleStorageUnit
        from transfer_queue.utils.zmq_utils import process_zmq_server_info
        conf = OmegaConf.merge(OmegaConf.create({}, flags={"allow_objects": True}),
                               OmegaConf.load(resources.files("transfer_queue") / "config.yaml"),
                               {"backend": {"SimpleStorage": {"num_data_storage_units": 1}}})
        self.controller = TransferQueueController.options(num_cpus=0).remote(
            sampler=SequentialSampler(), polling_mode=conf.controller.polling_mode)
        conf.controller.zmq_info = process_zmq_server_info(self.controller)
        unit_conf = dict(conf.backend.SimpleStorage)
        unit_conf["_run_id"] = uuid4().hex
        self.unit = SimpleStorageUnit.options(num_cpus=0).remote(config=unit_conf)
        conf.backend.SimpleStorage.zmq_info = process_zmq_server_info({f"{name}#0": self.unit})
        ray.get(self.controller.store_config.remote(conf))
        self.client = TransferQueueClient(client_id=f"bench-{name}-{os.getpid()}",
                                          controller_info=conf.controller.zmq_info)
        self.client.initialize_storage_manager(manager_type=conf.backend.storage_backend,
                                               config=conf.backend.SimpleStorage)

    def close(self) -> None:
        import ray
        self.client.close()
        try:
            ray.get(self.unit.shutdown.remote(), timeout=15)
        finally:
            ray.kill(self.unit)
            ray.kill(self.controller)


def current() -> Any:
    """The client the module-level calls go to now (the system `transfer_queue.init` made)."""
    import transfer_queue
    return transfer_queue.get_client()


def use(client: Any) -> None:
    """Make ``client`` the one every module-level `transfer_queue` call goes to. TransferQueue
    0.1.11 has no public way to do this: the harness sets the module global its calls read (the
    only private name of TransferQueue it touches; a TransferQueue without it fails here)."""
    from transfer_queue import interface
    if not hasattr(interface, "_TQ_CLIENT"):
        raise RuntimeError("bench verl: transfer_queue.interface has no _TQ_CLIENT to point at "
                           "each implementation's TransferQueue (written for TransferQueue 0.1.11)")
    interface._TQ_CLIENT = client


class Systems(dict):
    """partition -> the client of its TransferQueue (the first implementation's is the one
    `transfer_queue.init` made); ``owned``: the systems this run started, to close."""

    def __init__(self) -> None:
        super().__init__()
        self.main = current()
        self.owned: list[System] = []

    def of(self, part: str) -> Any:
        """The client of ``part``'s TransferQueue, started at first use, and made current."""
        client = self.get(part)
        if client is None:
            if not self:
                client = self.main
            else:
                system = System(part)
                self.owned.append(system)
                client = system.client
            self[part] = client
        use(client)
        return client
