"""A plugin's `_manifest.json` (manifest_version 2, as maibot-plugin-sdk plugins ship it): parsing with a
clear reason per refusal, the host and SDK version ranges, and the Python package dependencies.

What MaiBot 1.x checks, and we check the same way: `host_application` and `sdk` are closed ranges of
strict X.Y.Z versions; the host version must lie within the range, except that a host newer than
`max_version` only in its patch number still loads (MaiBot's "compatibility mode", a warning). The
plugin id is dotted or dashed (`github.author.plugin`). Dependencies are `{"type": "plugin", "id",
"version_spec"}` or `{"type": "python_package", "name", "version_spec"}` (PEP 440 specifiers).
A package dependency is a requirement on the package index and nothing else: `name` is a PEP 508 name,
`version_spec` a specifier set with optional extras before it and an environment marker after it
(`[socks]>=2.0; python_version >= "3.11"`); a direct URL or path (`@ https://…`, `@ file:///…`) is refused
with the manifest, since installing it would fetch code from anywhere (MaiBot accepts one).
Cosmetic fields MaiBot also demands (author, license, urls, i18n) are read when present and never a
reason to refuse; unknown fields are kept and ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Annotated, Literal

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# The MaiBot version whose plugins we declare to host: a plugin's `host_application` range must
# contain it (patch-newer than `max_version` still loads, as in MaiBot). 1.2.1: MaiBot's adapter plugins
# (message gateways, plugins.gateways) arrived with 1.2, and the official NapCat adapter plugin accepts
# 1.2.0-1.2.99 only; what that costs and gains on the public index is in README (Plugins, host version).
HOST_APPLICATION_VERSION = "1.2.1"
SDK_DISTRIBUTION = "maibot-plugin-sdk"
MANIFEST_FILE = "_manifest.json"
ENTRY_FILE = "plugin.py"

_SEMVER = re.compile(r"^\d+\.\d+\.\d+$")
_PLUGIN_ID = re.compile(r"^[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)+$")


def is_plugin_id(value: str) -> bool:
    """A plugin's own id as its manifest must give it (a dependency's id only has the form)."""
    return bool(_PLUGIN_ID.fullmatch(value)) and len(value) <= 200


_ID_RULE = "must be letters/digits/underscores separated by dots or dashes, e.g. github.author.plugin"
# PEP 508's name: letters and digits at both ends, dots, dashes and underscores between.
_PACKAGE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,198}[A-Za-z0-9])?$")
MAX_MANIFEST_BYTES = 256 * 1024


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, str_strip_whitespace=True)


class VersionRange(_Model):
    min_version: str
    max_version: str

    @field_validator("min_version", "max_version")
    @classmethod
    def _semver(cls, value: str) -> str:
        if not _SEMVER.fullmatch(value):
            raise ValueError("must be a strict X.Y.Z version, e.g. 1.0.0")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> VersionRange:
        if semver(self.min_version) > semver(self.max_version):
            raise ValueError("min_version is greater than max_version")
        return self


def _specifier(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    try:
        SpecifierSet(value)
    except InvalidSpecifier as exc:
        raise ValueError(f"invalid version specifier: {exc}") from exc
    return value


class PluginDependency(_Model):
    type: Literal["plugin"]
    id: str
    version_spec: str

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _PLUGIN_ID.fullmatch(value):
            raise ValueError(_ID_RULE)
        return value

    @field_validator("version_spec")
    @classmethod
    def _spec(cls, value: str) -> str:
        return _specifier(value)


class PythonPackageDependency(_Model):
    type: Literal["python_package"]
    name: str
    version_spec: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _PACKAGE_NAME.fullmatch(value):
            raise ValueError(
                "a package name has only letters, digits, dots, underscores and dashes, "
                "and starts and ends with a letter or digit"
            )
        return value

    @field_validator("version_spec")
    @classmethod
    def _spec(cls, value: str) -> str:
        if not value:
            raise ValueError("must not be empty")
        if len(value) > 1000:
            raise ValueError("must be at most 1000 characters")
        try:
            parsed = Requirement(f"placeholder{value}")
        except InvalidRequirement as exc:
            raise ValueError(f"invalid version specifier: {exc}") from exc
        if parsed.url is not None:
            raise ValueError(
                "a direct URL or path is not allowed: give a version specifier (e.g. >=1.0) of a package "
                "on the package index"
            )
        return value

    @property
    def requirement(self) -> Requirement:
        """The dependency as a requirement on the package index (its name canonical: never a path)."""
        return Requirement(f"{canonicalize_name(self.name)}{self.version_spec}")

    def applies(self) -> bool:
        """Whether its environment marker (if any) holds for this interpreter."""
        marker = self.requirement.marker
        return marker is None or marker.evaluate({**default_environment(), "extra": ""})


Dependency = Annotated[PluginDependency | PythonPackageDependency, Field(discriminator="type")]


class Manifest(_Model):
    manifest_version: Literal[2]
    id: str
    version: str
    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=4000)
    host_application: VersionRange
    sdk: VersionRange
    dependencies: list[Dependency] = Field(default_factory=list, max_length=200)
    capabilities: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=500
    )
    plugin_type: str = "extension"

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not is_plugin_id(value):
            raise ValueError(_ID_RULE)
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not _SEMVER.fullmatch(value):
            raise ValueError("must be a strict X.Y.Z version, e.g. 1.0.0")
        return value

    @model_validator(mode="after")
    def _dependencies(self) -> Manifest:
        seen: set[str] = set()
        for dep in self.dependencies:
            key = f"plugin:{dep.id}" if isinstance(dep, PluginDependency) else f"package:{dep.name.lower()}"
            if isinstance(dep, PluginDependency) and dep.id == self.id:
                raise ValueError("a plugin cannot depend on itself")
            if key in seen:
                raise ValueError(f"dependency declared twice: {key}")
            seen.add(key)
        return self

    @property
    def plugin_dependencies(self) -> list[PluginDependency]:
        return [d for d in self.dependencies if isinstance(d, PluginDependency)]

    @property
    def package_dependencies(self) -> list[PythonPackageDependency]:
        return [d for d in self.dependencies if isinstance(d, PythonPackageDependency)]


class ManifestError(Exception):
    """Why a plugin folder's manifest is refused (the message is shown to the operator)."""


@dataclass
class Checked:
    manifest: Manifest
    warnings: list[str] = field(default_factory=list)


def semver(value: str) -> tuple[int, int, int]:
    """X.Y.Z (or any PEP 440 version: its release part) as a comparable triple."""
    try:
        release = list(Version(value).release[:3])
    except InvalidVersion:
        return (0, 0, 0)
    return tuple(release + [0] * (3 - len(release)))  # type: ignore[return-value]


def _validation_reason(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:10]:
        where = ".".join(str(p) for p in err["loc"]) or "manifest"
        message = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def read_manifest(folder: Path) -> Manifest:
    """Parse the folder's manifest; ManifestError says why it cannot be used."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(f"no {MANIFEST_FILE}")
    if not (folder / ENTRY_FILE).is_file():
        raise ManifestError(f"no {ENTRY_FILE}")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{MANIFEST_FILE} is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{MANIFEST_FILE} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{MANIFEST_FILE} must hold a JSON object")
    if data.get("manifest_version") == 1:
        raise ManifestError("manifest_version 1 (legacy plugin system) is not supported by this host; only 2")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(f"{MANIFEST_FILE}: {_validation_reason(exc)}") from None


def sdk_version() -> str:
    try:
        return importlib_metadata.version(SDK_DISTRIBUTION)
    except importlib_metadata.PackageNotFoundError:
        return ""


def check_compatibility(manifest: Manifest, *, host_version: str = HOST_APPLICATION_VERSION) -> list[str]:
    """The warnings of a compatible manifest; ManifestError when the host or the SDK is out of range."""
    warnings = []
    host, low, high = (
        semver(host_version),
        semver(manifest.host_application.min_version),
        semver(manifest.host_application.max_version),
    )
    if host < low:
        raise ManifestError(
            f"host_application needs MaiBot >= {manifest.host_application.min_version}; "
            f"this host is compatible with MaiBot {host_version}"
        )
    if host > high:
        if host[:2] == high[:2]:
            warnings.append(
                f"loaded in compatibility mode: MaiBot {host_version} is newer than max_version "
                f"{manifest.host_application.max_version} only in its patch number"
            )
        else:
            raise ManifestError(
                f"host_application allows MaiBot up to {manifest.host_application.max_version}; "
                f"this host is compatible with MaiBot {host_version}"
            )
    installed = sdk_version()
    sdk = semver(installed)
    if not (semver(manifest.sdk.min_version) <= sdk <= semver(manifest.sdk.max_version)):
        raise ManifestError(
            f"sdk range {manifest.sdk.min_version}–{manifest.sdk.max_version} does not contain the installed "
            f"{SDK_DISTRIBUTION} {installed or '(not installed)'}"
        )
    return warnings


@dataclass(frozen=True)
class Unsatisfied:
    """A package dependency this environment does not satisfy: absent (`installed` None) or at a version
    outside the dependency's specifier."""

    dependency: PythonPackageDependency
    installed: str | None

    def __str__(self) -> str:
        dep = self.dependency
        state = "not installed" if self.installed is None else f"installed: {self.installed}"
        return f"{dep.name}{dep.version_spec} ({state})"


def unsatisfied_packages(manifest: Manifest) -> list[Unsatisfied]:
    """The package dependencies (whose marker applies here) this environment does not satisfy."""
    found = []
    for dep in manifest.package_dependencies:
        if not dep.applies():
            continue
        try:
            installed = importlib_metadata.version(dep.name)
        except importlib_metadata.PackageNotFoundError:
            found.append(Unsatisfied(dep, None))
            continue
        if not dep.requirement.specifier.contains(installed, prereleases=True):
            found.append(Unsatisfied(dep, installed))
    return found


def missing_packages(manifest: Manifest) -> list[str]:
    """The Python package dependencies not satisfied in this environment, each with why."""
    return [str(u) for u in unsatisfied_packages(manifest)]


def plugin_dependency_satisfied(dep: PluginDependency, version: str) -> bool:
    return SpecifierSet(dep.version_spec, prereleases=True).contains(version, prereleases=True)
