"""/dashboard rendered by a real headless Chromium: the DOM must list the workers."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from gateway_support import MODEL_A, MODEL_B

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install -y chromium)")


async def render(url: str, tmp_path) -> str:
    """The DOM after scripts ran (virtual time lets the first fetch and redraw finish)."""
    process = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'chrome'}",
        "--virtual-time-budget=5000", "--dump-dom", url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=90)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return out.decode()


async def test_dashboard_shows_every_worker(gateway, mock_fleet, tmp_path):
    dom = await render(gateway.url + "/dashboard", tmp_path)
    for worker in mock_fleet["a"] + mock_fleet["b"]:
        assert f'data-address="{worker.address}"' in dom
    assert MODEL_A in dom and MODEL_B in dom
    assert "3/3 workers serving" in dom


async def test_dashboard_with_keys_needs_the_admin_key(start_gateway, mock_fleet, keys_file, tmp_path):
    path, keys = keys_file
    worker = mock_fleet["b"][0]
    server = await start_gateway([worker.address], api_key_file=str(path))
    locked = await render(server.url + "/dashboard", tmp_path)
    assert worker.address not in locked and "needs an admin API key" in locked
    unlocked = await render(server.url + f"/dashboard#key={keys['ops']}", tmp_path)
    assert f'data-address="{worker.address}"' in unlocked
