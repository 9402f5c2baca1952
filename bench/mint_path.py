"""`python -m bench.mint_path`: CPU per certificate of pilot's minting alone, in process.

What `bench.certificates` cannot separate from the rest of a proxy's arrival:
the secret manager asked for N certificates at once (as N proxies' first
streams would), pilot's own CA signing, until every `ready` callback has run.
No gRPC, no SDS response: the key pair, the certificate, the thread hand-offs,
the secret manager's task and log line. Reported: CPU seconds (all threads of
this process) and wall time per certificate. Run it with another checkout's
pilot first on PYTHONPATH (`PYTHONPATH=OLD python bench/mint_path.py`) to
compare two versions; alternate them, the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path

from pilot.security.ca import CaSettings, CertificateAuthority
from pilot.security.ca_client import LocalCa
from pilot.security.secrets import SdsSettings, SecretManager
from pilot.xds.proxy import ProxyKey

SIGNING_SLOTS = 4  # as pilot discovery has them


async def measure(count: int, folder: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per certificate for `count` certificates wanted at once."""
    ca = CertificateAuthority.load(CaSettings(state_dir=folder / "ca"))
    secrets = SecretManager(
        LocalCa(ca, asyncio.Semaphore(SIGNING_SLOTS)), ca.root_pem, SdsSettings()
    )
    proxies = [
        ProxyKey(
            f"sidecar~10.0.0.1~proxy-{i}.ns~ns.svc.cluster.local",
            f"spiffe://cluster.local/ns/ns-{i % 50}/sa/sa-{i}",
        )
        for i in range(count)
    ]
    done = asyncio.Event()
    ready: set[ProxyKey] = set()

    def minted(proxy: ProxyKey) -> None:
        ready.add(proxy)
        if len(ready) == count:
            done.set()

    cpu, wall = time.process_time(), time.perf_counter()
    for proxy in proxies:
        secrets.want(proxy, minted)
    await done.wait()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await secrets.close()
    return cpu / count, wall / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mint_path", description=__doc__)
    parser.add_argument("--certificates", type=int, default=2000, help="(2000)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pilot-mint-") as folder:
        # pilot logs each mint at INFO: to a file, as pilot's stderr would be.
        logging.basicConfig(filename=str(Path(folder) / "pilot.log"), level=logging.INFO)
        cpu, wall = asyncio.run(measure(args.certificates, Path(folder)))
    print(
        f"{args.certificates:,} certificates: CPU {cpu * 1e3:.3f} ms, wall {wall * 1e3:.3f} ms each"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
