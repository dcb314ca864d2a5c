"""Keep secrets out of everything a run writes: logger files, W&B config and run settings (name,
notes, tags, group), TensorBoard text, Hydra's files, checkpoints. Every writer applies
`redact_secrets` (or `redact_argv` to command-line arguments); there is no other rule.

Five rules, applied to a copy of the config:

1. A value whose key names a secret is replaced by ``"***"``: the key's last word is ``token``,
   ``secret``, ``password``, ``passwd``, ``passphrase``, ``apikey`` or ``credential(s)``; or its
   last two words are ``api key``, ``access key``, ``private key``, ``secret key``, ``signing key``
   or ``encryption key``; or the whole key is ``key``, ``auth`` or ``authorization``. Words are
   split at ``_``, ``-``, ``.`` and camelCase, case-insensitively: ``api_key``, ``apiKey``,
   ``WANDB_API_KEY``, ``hf_token``, ``client_secret`` are secret; ``max_tokens``, ``tokenizer``,
   ``key_dim`` are not, nor are a tokenizer's special tokens (``pad_token``, ``eos_token`` ...).
2. Any string that contains the value of a secret-named environment variable (by rule 1, e.g.
   ``WANDB_API_KEY``, ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``; values of 8 characters or more) has
   that value replaced by ``"***"`` -- this catches ``${oc.env:HF_TOKEN}`` interpolated anywhere.
3. Credentials in URLs (``https://user:password@host``) become ``https://***@host``.
4. Inside any string, an assignment to a secret-named key (by rule 1) has its value replaced:
   ``api_key='sk-...'`` and ``'api_key': 'sk-...'`` (an object's text, such as a
   ``functools.partial(Client, api_key='sk-...')``; a dict's repr), ``?token=abc&`` in a URL.
5. Any string that contains a value held under a secret-named key (by rule 1) anywhere in the same
   config, or one of the ``secrets`` a writer passes (`secret_values` of the run's config, for
   a writer that writes settings apart from the config), has that value replaced -- this catches
   ``notes: run for ${hub.hf_token}``. Values of 4 characters or more, so that a short one such as
   ``0`` does not blank out unrelated text.

`redact_argv` applies the same rules to command-line overrides (``data.hf_token=...``).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Iterable, Mapping

REDACTED = "***"
_SECRET_LAST_WORDS = frozenset(
    {"token", "secret", "password", "passwd", "passphrase", "apikey", "credential", "credentials"}
)
_SECRET_KEY_QUALIFIERS = frozenset({"api", "access", "private", "secret", "signing", "encryption"})
_SECRET_WHOLE_NAMES = frozenset({"key", "auth", "authorization"})
_SPECIAL_TOKEN_WORDS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "start", "end"})
_MIN_ENV_SECRET_LENGTH = 8  # shorter values would also match ordinary strings (paths, names)
_MIN_KEYED_SECRET_LENGTH = 4  # a value under a secret-named key (rule 5): a deliberate secret, even a short one
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)")
# name=value, or 'name': value with the name quoted (a dict's repr); the value quoted or up to a separator.
_ASSIGNMENT = re.compile(r"""(?P<name>(?<![\w.-])[A-Za-z_][\w.-]*(?=\s*=)|(?P<q>['"])[A-Za-z_][\w.-]*(?P=q)(?=\s*:))"""
                         r"""(?P<sep>\s*[=:]\s*)(?P<value>'[^']*'|"[^"]*"|[^\s,;&)\]}'"]+)""")


def is_secret_key(key: Any) -> bool:
    """Whether a config key or environment variable name names a secret (rule 1 above)."""
    return isinstance(key, str) and _is_secret_name(key)


@functools.lru_cache(maxsize=4096)  # (every log line checks every environment variable's name)
def _is_secret_name(key: str) -> bool:
    words = [word.lower() for word in _WORD.findall(key)]
    if not words:
        return False
    if len(words) == 1 and words[0] in _SECRET_WHOLE_NAMES:
        return True
    if words[-1] in _SECRET_LAST_WORDS:
        return not (words[-1] == "token" and len(words) > 1 and words[-2] in _SPECIAL_TOKEN_WORDS)
    return len(words) > 1 and words[-1] == "key" and words[-2] in _SECRET_KEY_QUALIFIERS


def secret_env_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of the secret-named environment variables, longest first (rule 2 above)."""
    environ = os.environ if environ is None else environ
    values = {value for name, value in environ.items() if is_secret_key(name) and len(value) >= _MIN_ENV_SECRET_LENGTH}
    return sorted(values, key=len, reverse=True)


def secret_values(config: Any) -> list[str]:
    """Values held under secret-named keys anywhere in ``config`` (nested mappings and lists), as
    text, longest first (rule 5 above)."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                if is_secret_key(key) and isinstance(value, (str, int, float)) and not isinstance(value, bool):
                    if len(str(value)) >= _MIN_KEYED_SECRET_LENGTH and str(value) != REDACTED:
                        found.add(str(value))
                else:
                    walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(config)
    return sorted(found, key=len, reverse=True)


def redact_secrets(config: Any, environ: Mapping[str, str] | None = None, secrets: Iterable[str] = ()) -> Any:
    """A copy of ``config`` (nested mappings, lists, tuples, scalars) with secrets replaced by
    ``"***"``; the input is not modified. ``environ`` defaults to ``os.environ``; ``secrets``: more
    values to replace (rule 5)."""
    known = set(secret_env_values(environ)) | set(secret_values(config)) | {s for s in secrets if s}
    values = sorted(known, key=len, reverse=True)  # longest first: a value inside another goes after it

    def clean(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: (REDACTED if is_secret_key(k) and v not in (None, "") else clean(v)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(clean(v) for v in value)
        if isinstance(value, str):
            for secret in values:
                value = value.replace(secret, REDACTED)
            return _ASSIGNMENT.sub(_redact_assignment, _URL_CREDENTIALS.sub(REDACTED, value))
        return value

    return clean(config)


def _redact_assignment(match: re.Match) -> str:
    """Rule 4 for one ``name=value`` found in a string."""
    name = match["name"].strip("'\"")
    if not is_secret_key(name.rsplit(".", 1)[-1]):
        return match[0]
    value = match["value"]
    quote = value[0] if value[0] in "'\"" else ""
    return f"{match['name']}{match['sep']}{quote}{REDACTED}{quote}"


def redact_argv(argv: list[str], environ: Mapping[str, str] | None = None, secrets: Iterable[str] = ()) -> list[str]:
    """Command-line arguments with secrets redacted: ``key=value`` overrides whose last key part
    names a secret (``+data.hf_token=abc`` -> ``+data.hf_token=***``), then the rules above (with
    ``secrets`` as in `redact_secrets`)."""
    secrets = list(secrets)
    redacted = []
    for argument in argv:
        key, equals, _ = argument.partition("=")
        if equals and is_secret_key(key.lstrip("+~-").rsplit(".", 1)[-1]):
            argument = key + "=" + REDACTED
        redacted.append(redact_secrets(argument, environ, secrets))
    return redacted
