"""``raftwal init``: the files of a cluster on real machines, one directory per host.

``raftwal init --hosts n1=10.0.0.1,n2=10.0.0.2,n3=10.0.0.3 --out DIR [--secure]`` writes:

- ``DIR/<id>/``, for each host (copy it to that host's ``/etc/raftwal``):
  - ``raftwal.toml``: the cluster's config, the same text on every host; its paths are
    relative to the file, so the directory works wherever it is copied;
  - ``node.env``: ``RAFTWAL_NODE_ID=<id>``, read by ``deploy/systemd/raftwal.service``;
  - ``secret``: the Raft transport secret, the same on every host;
  - with ``--secure``: ``ca.pem``, this host's ``node.pem`` and ``node.key`` (naming its
    host as well as localhost) and ``auth_tokens``: the node token in clear (nodes present
    it to each other) and every other role's token as its SHA-256 only (``sha256:``: a
    node checks those, so no host holds a client's token);
- with ``--secure``, ``DIR/client/``: ``ca.pem``, ``client.pem``, ``client.key`` and
  ``tokens/<role>`` for the SDK and the CLI (give each application the one file of its
  role, and ``tokens/admin`` to operators only), and ``DIR/ca/``: the CA with its key,
  which belongs offline (``raftwal dev renew-certs --ca-cert --ca-key`` issues new
  certificates under it).

Every file is written 0600 in 0700 directories. docs/deploy.md walks through the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from raftwal.cli import devcerts
from raftwal.node.config import (
    MIN_SECRET_CHARS,
    ClusterConfig,
    ConfigError,
    NodeConfig,
    parse_config,
    render_config,
    with_join,
    write_secret_file,
)
from raftwal.node.security import NODE, token_digest_line
from statemachine.validation import NAME_RULE, is_plain_name

CONFIG_FILE = "raftwal.toml"
NODE_ENV_FILE = "node.env"
SECRET_FILE = "secret"
CA_FILE = "ca.pem"
NODE_CERT_FILE = "node.pem"
NODE_KEY_FILE = "node.key"
TOKENS_FILE = "auth_tokens"
CLIENT_DIR = "client"
CA_DIR = "ca"
DEFAULT_DATA_DIR = "/var/lib/raftwal"
DEFAULT_PORTS = {"grpc": 7201, "raft": 7301, "metrics": 9201, "transfer": 7601}
#: Fixed ports for a host's first data workers (DESIGN.md section 2), so that a firewall
#: can name them: worker k's gRPC port is 7211 + k, its transfer port 7601 + k (worker 0's
#: is the node's transfer port). Workers past these (a host with more cores) take free
#: ports; `data_workers` in a node's table caps how many it runs.
DEFAULT_WORKER_PORTS = 8
WORKER_GRPC_BASE = 7211


@dataclass(frozen=True)
class Layout:
    """What ``init`` wrote (absolute paths)."""

    host_dirs: dict[str, Path]  # node id -> its directory
    client_dir: Path | None
    ca_dir: Path | None


def parse_hosts(text: str) -> dict[str, str]:
    """``n1=10.0.0.1,n2=host2.example`` -> {"n1": "10.0.0.1", ...}, validated."""
    hosts: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        node_id, sep, host = item.partition("=")
        if not sep or not node_id or not host:
            raise ConfigError(
                f"invalid --hosts item ({item!r}; expected ID=HOST, e.g. n1=10.0.0.1)"
            )
        if not is_plain_name(node_id) or len(node_id) > 64:
            raise ConfigError(f"invalid node id in --hosts ({node_id!r}; expected {NAME_RULE})")
        if node_id in hosts:
            raise ConfigError(f"node id {node_id!r} twice in --hosts (expected each once)")
        hosts[node_id] = host
    by_host: dict[str, list[str]] = {}
    for node_id, host in hosts.items():
        by_host.setdefault(host, []).append(node_id)
    shared = {host: ids for host, ids in by_host.items() if len(ids) > 1}
    if shared:
        host, ids = next(iter(shared.items()))
        raise ConfigError(
            f"nodes {', '.join(ids)} all at {host} in --hosts (expected one node per host, as "
            "every node gets the same ports; `raftwal dev up` runs several nodes on one machine)"
        )
    return hosts


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _write(path: Path, text: str | bytes) -> None:
    devcerts.write_private(path, text.encode() if isinstance(text, str) else text)


def _copy(source: Path, target: Path) -> None:
    _write(target, source.read_bytes())


def init_deployment(
    hosts: Mapping[str, str],
    out: Path,
    *,
    secure: bool = False,
    data_dir: str = DEFAULT_DATA_DIR,
    ports: Mapping[str, int] | None = None,
    listen_host: str | None = None,
    data_nodes: Sequence[str] = (),
    join: Sequence[str] = (),
    ca_cert_file: Path | None = None,
    ca_key_file: Path | None = None,
    secret_file: Path | None = None,
) -> Layout:
    """Write the per-host directories for `hosts` into `out` (which must not exist or be
    empty). `data_dir` may hold ``{id}``; without it each node keeps its data in
    `data_dir` itself (one node per host). With `join` (gRPC endpoints of a running
    cluster) the hosts join that cluster (raftwal/node/join.py); with `ca_cert_file` and
    `ca_key_file`, ``secure`` issues certificates under that CA (the running cluster's)
    instead of a new one."""
    if len(hosts) < 1:
        raise ConfigError("no hosts (expected --hosts n1=HOST,n2=HOST,n3=HOST)")
    unknown = [n for n in data_nodes if n not in hosts]
    if unknown:
        raise ConfigError(
            f"unknown --data-nodes {', '.join(unknown)} (expected ids of --hosts: "
            f"{', '.join(hosts)})"
        )
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty (expected a new or empty directory)")
    port = {**DEFAULT_PORTS, **(ports or {})}
    nodes = tuple(
        NodeConfig(
            id=node_id,
            host=host,
            grpc_port=port["grpc"],
            raft_port=port["raft"],
            metrics_port=port["metrics"],
            transfer_port=port["transfer"],
            data_dir=Path(data_dir.replace("{id}", node_id)),
            role="data" if node_id in data_nodes else "voter",
            listen_host=listen_host,
            worker_grpc_ports=tuple(
                port.get("worker_grpc", WORKER_GRPC_BASE) + k for k in range(DEFAULT_WORKER_PORTS)
            ),
            worker_transfer_ports=tuple(port["transfer"] + k for k in range(DEFAULT_WORKER_PORTS)),
        )
        for node_id, host in hosts.items()
    )
    config = ClusterConfig(nodes=nodes, join=tuple(join))
    text = render_config(config, secret_file=SECRET_FILE)
    if secure:
        # Paths relative to the config file: one text for every host.
        text = text.replace(
            "[cluster]\n",
            "[cluster]\n"
            f'tls_cert_file = "{NODE_CERT_FILE}"\n'
            f'tls_key_file = "{NODE_KEY_FILE}"\n'
            f'tls_ca_file = "{CA_FILE}"\n'
            'tls_client_auth = "require"\n'
            f'auth_tokens_file = "{TOKENS_FILE}"\n',
            1,
        )
    text = (
        "# raftwal cluster configuration, written by `raftwal init`: the same file on every\n"
        "# host, each started with `raftwal node --config raftwal.toml --id ID` (or the\n"
        "# systemd unit in deploy/systemd, which reads the id from node.env).\n" + text
    )
    # The text must parse (a wildcard host, say, is refused there) before anything lands
    # on disk; only the secret, which does not exist yet, is left out of the check.
    parse_config(
        tomllib.loads(text.replace(f'secret_file = "{SECRET_FILE}"\n', "", 1)), out, environ={}
    )
    _private_dir(out)
    host_dirs = {node_id: _private_dir(out / node_id) for node_id in hosts}
    first = host_dirs[next(iter(hosts))]
    if secret_file is None:
        write_secret_file(first / SECRET_FILE)
    else:
        # The running cluster's secret, for hosts that join it.
        secret = secret_file.read_text().strip()
        if len(secret) < MIN_SECRET_CHARS:
            raise ConfigError(
                f"invalid --secret-file {secret_file} (a secret of {len(secret)} chars; "
                f"expected >= {MIN_SECRET_CHARS}: the cluster's own)"
            )
        _write(first / SECRET_FILE, secret + "\n")
    for node_id, directory in host_dirs.items():
        _write(directory / CONFIG_FILE, text)
        _write(directory / NODE_ENV_FILE, f"RAFTWAL_NODE_ID={node_id}\n")
        if directory != first:
            _copy(first / SECRET_FILE, directory / SECRET_FILE)
    client_dir = ca_dir = None
    if secure:
        ca_dir = _private_dir(out / CA_DIR)
        security = devcerts.generate(ca_dir, list(hosts), ca_cert_file, ca_key_file, hosts=hosts)
        client_dir = _private_dir(out / CLIENT_DIR)
        _copy(security.ca_file, client_dir / CA_FILE)
        _copy(security.client_cert_file, client_dir / "client.pem")
        _copy(security.client_key_file, client_dir / "client.key")
        tokens_dir = _private_dir(client_dir / "tokens")
        for role, path in security.token_files.items():
            _copy(path, tokens_dir / role)
        tokens_text = _host_tokens(security)
        for node_id, directory in host_dirs.items():
            cert, key = security.node_certs[node_id]
            _copy(security.ca_file, directory / CA_FILE)
            _copy(cert, directory / NODE_CERT_FILE)
            _copy(key, directory / NODE_KEY_FILE)
            _write(directory / TOKENS_FILE, tokens_text)
        # The CA directory keeps the CA (ca.pem, ca.key) and nothing a host needs.
        for name in ("client.pem", "client.key", *(f"{n}.pem" for n in hosts)):
            (ca_dir / devcerts.TLS_DIR / name).unlink(missing_ok=True)
        for node_id in hosts:
            (ca_dir / devcerts.TLS_DIR / f"{node_id}.key").unlink(missing_ok=True)
        os.chmod(ca_dir / devcerts.TLS_DIR / devcerts.CA_CERT_FILE, 0o600)
        shutil.rmtree(ca_dir / devcerts.TOKENS_DIR, ignore_errors=True)
        (ca_dir / devcerts.TOKENS_FILE).unlink(missing_ok=True)
    return Layout(host_dirs=host_dirs, client_dir=client_dir, ca_dir=ca_dir)


def _host_tokens(security: devcerts.DevSecurity) -> str:
    """A host's auth_tokens: the node token in clear, every user role's as its digest."""
    node_lines = [
        line
        for line in security.auth_tokens_file.read_text().splitlines()
        if line.split(" ", 1)[0] == NODE
    ]
    return (
        "# Tokens this node accepts, `<role> <token>` per line (SECURITY.md). The node token\n"
        "# is in clear: nodes present it to each other. The others are their SHA-256 only\n"
        "# (`sha256:`): a node checks them, so this host holds no client's token. To add a\n"
        "# token: `<role> sha256:<printf %s TOKEN | sha256sum>` (or the token itself).\n"
        + "".join(f"{line}\n" for line in node_lines)
        + "".join(
            token_digest_line(role, path.read_text().strip()) + "\n"
            for role, path in security.token_files.items()
        )
    )


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "init",
        help="write each host's config, the secret and (--secure) certificates and tokens for "
        "a cluster on real machines",
    )
    parser.add_argument(
        "--hosts",
        required=True,
        help="ID=HOST,... one node per machine, HOST as the others reach it (e.g. "
        "n1=10.0.0.1,n2=10.0.0.2,n3=10.0.0.3)",
    )
    parser.add_argument("--out", required=True, type=Path, help="a new directory to write into")
    parser.add_argument(
        "--secure",
        action="store_true",
        help="TLS with client certificates, and a bearer token per role (a new CA in OUT/ca)",
    )
    parser.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        help=f"each node's data directory; {{id}} is replaced by its id (default: "
        f"{DEFAULT_DATA_DIR})",
    )
    parser.add_argument(
        "--listen-host",
        default=None,
        help="where every node listens (e.g. 0.0.0.0); default: on its HOST",
    )
    parser.add_argument(
        "--data-nodes",
        default="",
        help="ids (comma-separated) of nodes that follow the Raft log without voting",
    )
    for name, number in DEFAULT_PORTS.items():
        parser.add_argument(f"--{name}-port", type=int, default=number, help=f"(default: {number})")
    parser.add_argument(
        "--join",
        default="",
        metavar="ENDPOINTS",
        help="host:port,... gRPC endpoints of a running cluster: the hosts join it as data "
        "nodes (`raftwal member add ID` then makes each a voter)",
    )
    parser.add_argument(
        "--ca-cert", type=Path, default=None, help="with --secure: sign with this CA (PEM)"
    )
    parser.add_argument(
        "--ca-key", type=Path, default=None, help="with --ca-cert: its key (read, not copied)"
    )
    parser.add_argument(
        "--secret-file",
        type=Path,
        default=None,
        help="copy this cluster secret (with --join: the running cluster's) instead of "
        "making a new one",
    )
    parser.add_argument("--json", action="store_true", help="print what was written as JSON")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    ports = {name: getattr(args, f"{name}_port") for name in DEFAULT_PORTS}
    try:
        for name, number in ports.items():
            if not 1 <= number <= 65535:
                raise ConfigError(f"invalid --{name}-port ({number}; expected 1..65535)")
        if len(set(ports.values())) != len(ports):
            raise ConfigError(
                f"ports used twice ({', '.join(f'{k} {v}' for k, v in ports.items())}; "
                "expected four different ports)"
            )
        layout = init_deployment(
            parse_hosts(args.hosts),
            args.out,
            secure=args.secure,
            data_dir=args.data_dir,
            ports=ports,
            listen_host=args.listen_host,
            data_nodes=[n for n in args.data_nodes.split(",") if n],
            join=with_join(ClusterConfig(nodes=()), args.join).join if args.join else (),
            ca_cert_file=args.ca_cert,
            ca_key_file=args.ca_key,
            secret_file=args.secret_file,
        )
    except (ConfigError, OSError, devcerts.CertificateError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {
                    "hosts": {k: str(v) for k, v in layout.host_dirs.items()},
                    "client": str(layout.client_dir) if layout.client_dir else None,
                    "ca": str(layout.ca_dir) if layout.ca_dir else None,
                }
            )
        )
        return 0
    for node_id, directory in layout.host_dirs.items():
        print(f"{node_id}: copy {directory}/ to /etc/raftwal/ on its host")
    if layout.client_dir is not None and layout.ca_dir is not None:
        print(
            f"clients: {layout.client_dir}/ (CA, client certificate, a token per role: give "
            "each application only tokens/<its role>, and tokens/admin to operators only)"
        )
        print(f"CA: {layout.ca_dir}/ (keep its key offline)")
    print("then on each host: raftwal node --config /etc/raftwal/raftwal.toml --id ID")
    print("(or deploy/systemd/raftwal.service); docs/deploy.md has the rest")
    return 0
