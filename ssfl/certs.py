"""TLS certificates and SuperNode keys for a deployment.

``make_certificates`` writes a CA (``ca.crt``, ``ca.key``) and the SuperLink's
certificate signed by it (``server.pem``, ``server.key``), valid for localhost,
127.0.0.1 and the given host names. ``make_node_key`` writes one SuperNode's
authentication key pair (``NAME`` in OpenSSH private-key format, ``NAME.pub``),
the P-384 ECDSA keys that ``ssh-keygen -t ecdsa -b 384`` makes.

Usable without torch: ``python -m ssfl.certs DIR --host superlink --nodes 2``; on an edge
machine ``python -m ssfl.certs DIR --node-key node`` makes only that node's key pair.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365
LOCAL_HOSTS = ("localhost", "127.0.0.1")


def _write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only."""
    path.write_bytes(data)
    os.chmod(path, 0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    """Subject alternative names: IP addresses as IPs, everything else as DNS names."""
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _builder(subject: str, issuer: str, public_key, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def make_certificates(
    out: Path, hosts: Sequence[str] = (), days: int = VALID_DAYS
) -> dict[str, Path]:
    """A CA and the SuperLink's certificate for ``hosts`` plus localhost; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = (
        _builder("ssfl CA", "ssfl CA", ca_key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA384())
    )
    server_key = ec.generate_private_key(ec.SECP384R1())
    all_hosts = [*hosts, *LOCAL_HOSTS]
    server_cert = (
        _builder(all_hosts[0], "ssfl CA", server_key.public_key(), days)
        .add_extension(_san(all_hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    paths = {
        "ca": out / "ca.crt",
        "ca_key": out / "ca.key",
        "cert": out / "server.pem",
        "key": out / "server.key",
    }
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(paths["ca_key"], _key_pem(ca_key))
    paths["cert"].write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(paths["key"], _key_pem(server_key))
    return paths


def make_node_key(out: Path, name: str) -> tuple[Path, Path]:
    """One SuperNode's P-384 key pair: ``out/name`` (private) and ``out/name.pub``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = out / name, out / f"{name}.pub"
    _write_private(
        private,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + f" {name}\n".encode()
    )
    return private, public


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ssfl.certs", description=__doc__)
    parser.add_argument("out", help="folder for ca.crt, server.pem, server.key and node keys")
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        help="a name or IP the SuperNodes use to reach the SuperLink (repeatable)",
    )
    parser.add_argument("--nodes", type=int, default=0, help="also make keys node0, node1, ...")
    parser.add_argument("--days", type=int, default=VALID_DAYS, help="validity in days")
    parser.add_argument(
        "--node-key",
        metavar="NAME",
        help="only make the key pair NAME, NAME.pub (an edge machine's; no CA, no certificate)",
    )
    args = parser.parse_args(argv)
    if args.node_key:
        if args.host or args.nodes:
            parser.error("--node-key makes one key pair only: leave out --host and --nodes")
        private, public = make_node_key(Path(args.out), args.node_key)
        print(f"wrote {private.name}, {public.name} to {args.out}")
        return 0
    paths = make_certificates(Path(args.out), args.host, args.days)
    for i in range(args.nodes):
        make_node_key(Path(args.out), f"node{i}")
    print(f"wrote {', '.join(p.name for p in paths.values())} to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
