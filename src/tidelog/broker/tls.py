"""TLS for SSL and SASL_SSL listeners: the server's `ssl.SSLContext` and the principal of a client certificate.

Kafka's PEM keystore: `ssl.keystore.location` is one PEM file with the private key and the certificate chain
(`ssl.key.password` if the key is encrypted); `ssl.truststore.location` holds the CA certificates that client
certificates must chain to. `ssl.client.auth` = none | requested | required. On an SSL listener a client that
presented a verified certificate is `User:<its subject DN>`, in RFC 2253 order as Java's X500Principal prints
it (`User:CN=alice,OU=eng,O=acme,C=US`); without one it is `User:ANONYMOUS`.
"""

from __future__ import annotations

import ssl
from typing import Any

from tidelog.errors import ConfigError

ANONYMOUS = "User:ANONYMOUS"

_PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}

# Python's attribute names -> the keywords X500Principal.getName() (RFC 2253) uses.
_RDN_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
    "emailAddress": "EMAILADDRESS",
}


def server_context(
    keystore: str,
    key_password: str | None,
    truststore: str | None,
    client_auth: str,
    enabled_protocols: tuple[str, ...],
    cipher_suites: tuple[str, ...] = (),
) -> ssl.SSLContext:
    """The context every TLS listener shares. File or key errors raise ConfigError naming the config key."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(_PROTOCOLS[p] for p in enabled_protocols)
    context.minimum_version, context.maximum_version = versions[0], versions[-1]
    try:
        context.load_cert_chain(keystore, password=key_password)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"config ssl.keystore.location: cannot load {keystore!r} (PEM key + chain): {exc}") from exc
    if truststore:
        try:
            context.load_verify_locations(cafile=truststore)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"config ssl.truststore.location: cannot load {truststore!r}: {exc}") from exc
    context.verify_mode = _CLIENT_AUTH[client_auth]
    if cipher_suites:
        try:
            context.set_ciphers(":".join(cipher_suites))
        except ssl.SSLError as exc:
            raise ConfigError(f"config ssl.cipher.suites: {exc}") from exc
    return context


def _escape(value: str) -> str:
    r"""RFC 2253 escaping: `,+"\<>;` anywhere, `#` or a space at the start, a space at the end."""
    out = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def distinguished_name(subject: tuple[tuple[tuple[str, str], ...], ...]) -> str:
    """`getpeercert()["subject"]` (RDNs in certificate order) -> RFC 2253 string (most specific RDN first)."""
    rdns = []
    for rdn in reversed(subject):
        rdns.append("+".join(f"{_RDN_KEYWORDS.get(key, key)}={_escape(value)}" for key, value in rdn))
    return ",".join(rdns)


def certificate_principal(ssl_object: Any) -> str:
    """`User:<DN>` of a verified client certificate, else `User:ANONYMOUS`."""
    if ssl_object is None:
        return ANONYMOUS
    certificate = ssl_object.getpeercert()
    subject = certificate.get("subject") if certificate else None
    return f"User:{distinguished_name(subject)}" if subject else ANONYMOUS
