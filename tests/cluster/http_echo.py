"""hashicorp/http-echo's behaviour, as the test kubelet runs that image: one program,
standard library only, run by path (`python tests/cluster/http_echo.py -listen=:5678
-text=hello`).

It takes http-echo's flags (`-listen=[HOST]:PORT`, default :5678; `-text=TEXT`;
`-status-code=N`, default 200) and answers every request with the text and a newline,
printing one line per request to stdout. On SIGTERM it exits at once, as http-echo does.
"""

from __future__ import annotations

import argparse
import http.server
import signal
import sys
from types import FrameType


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prefix_chars="-", description="http-echo, for tests")
    parser.add_argument("-listen", default=":5678")
    parser.add_argument("-text", required=True)
    parser.add_argument("-status-code", dest="status", type=int, default=200)
    return parser


def main(argv: list[str]) -> None:
    arguments = _parser().parse_args(argv)
    host, _, port = arguments.listen.rpartition(":")
    body = (arguments.text + "\n").encode()

    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(arguments.status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            print(f"{self.command} {self.path} from {self.client_address[0]}", flush=True)

    def stop(signum: int, frame: FrameType | None) -> None:
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    server = http.server.ThreadingHTTPServer((host or "0.0.0.0", int(port)), Echo)
    print(f"listening on {host or '0.0.0.0'}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
