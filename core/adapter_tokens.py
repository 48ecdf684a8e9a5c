"""Adapter tokens from the environment (MAIBOT_ADAPTER_TOKENS): each token bound to the one platform whose
adapter may present it, parsed with a clear error (chat.gateway.auth checks them).

The format: comma-separated `platform:token` entries (`qq:s3cret,discord:0ther`). A bare `token` (no
colon) is bound to `qq`, the platform of MaiBot's NapCat adapter and of the set-up page's token. A
token that itself contains a colon is written with its platform (`qq:a:b` is the token `a:b` for
qq). A token value names one adapter: the same value for two platforms is refused, as is anything
else that could be read two ways (an empty platform or token, a platform that is not a platform
name, whitespace in a token).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from django.core.exceptions import ImproperlyConfigured

# What a bare token is bound to.
DEFAULT_PLATFORM = "qq"
# The browser chat page's platform (chat.outbox.WEB_PLATFORM): no adapter may connect as it.
RESERVED_PLATFORMS = ("web",)
# A platform as adapters name it in their `platform` / `x-platform` header (case-sensitive).
PLATFORM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
# A deployment lists a few adapters; a longer list is a mistake (or a file pasted into a variable).
MAX_TOKENS = 256


@dataclass(frozen=True)
class AdapterToken:
    """One token and the platform its holder may connect as. The secret never appears in a repr (the
    settings object is printed by Django's debug pages and `diffsettings`)."""

    platform: str
    secret: str = field(repr=False)


def parse_adapter_tokens(value: str, *, name: str) -> tuple[AdapterToken, ...]:
    """The tokens of a MAIBOT_ADAPTER_TOKENS value (see the module's format).

    Raises ImproperlyConfigured naming the variable, the entry's position and its platform, never the
    token itself (the message reaches logs and the console)."""
    entries = [part.strip() for part in value.split(",") if part.strip()]
    if len(entries) > MAX_TOKENS:
        raise ImproperlyConfigured(f"{name}: at most {MAX_TOKENS} tokens, got {len(entries)}")
    tokens: list[AdapterToken] = []
    owner: dict[str, tuple[int, str]] = {}  # secret → (entry number, platform)
    for number, entry in enumerate(entries, start=1):
        platform, colon, secret = entry.partition(":")
        platform, secret = (platform.strip(), secret.strip()) if colon else (DEFAULT_PLATFORM, entry)
        where = f"{name}: entry {number}"
        if not PLATFORM_NAME.match(platform):
            # Not echoed: it may be part of a token.
            raise ImproperlyConfigured(
                f"{where}: what comes before the first ':' is not a platform name (letters, digits, _ . -);"
                f" write platform:token, or a bare token without ':' for platform {DEFAULT_PLATFORM!r}"
            )
        if platform in RESERVED_PLATFORMS:
            raise ImproperlyConfigured(f"{where}: platform {platform!r} is reserved for the browser chat page")
        if not secret:
            raise ImproperlyConfigured(f"{where}: platform {platform!r} has an empty token")
        if any(c.isspace() for c in secret):
            raise ImproperlyConfigured(f"{where}: the token for platform {platform!r} contains whitespace")
        if secret in owner:
            first, first_platform = owner[secret]
            if first_platform == platform:
                continue  # listed twice for one platform: nothing ambiguous
            raise ImproperlyConfigured(
                f"{where}: platform {platform!r} has the same token as entry {first} (platform"
                f" {first_platform!r}); a token names one adapter: give each platform its own"
            )
        owner[secret] = (number, platform)
        tokens.append(AdapterToken(platform=platform, secret=secret))
    return tuple(tokens)
