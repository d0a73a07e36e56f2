"""Free loopback ports for launching ranks by hand (tests, benchmarks)."""
import socket


def free_port_pair():
    """A port p on 127.0.0.1 with p + 1 free too (kiln's store listens on MASTER_PORT + 1)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no free port pair")
