"""One long-lived client per worker address, shared by everything in one event loop."""

from __future__ import annotations

from vllm_fleet.client.worker_client import ClientOptions, WorkerClient


class ClientPool:
    def __init__(self, options: ClientOptions | None = None) -> None:
        self.options = options or ClientOptions()
        self._clients: dict[str, WorkerClient] = {}

    def get(self, address: str) -> WorkerClient:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = WorkerClient(address, self.options)
        return client

    async def discard(self, address: str) -> None:
        client = self._clients.pop(address, None)
        if client is not None:
            await client.close()

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    def __contains__(self, address: str) -> bool:
        return address in self._clients
