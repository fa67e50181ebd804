"""The Delta JVM jars the delta-spark engine needs, fetched on demand into a local cache.

``resolve(package, cache_dir, spark_submit=...)`` returns the jar files of `package`
(``io.delta:delta-spark_4.1_2.13:<version>``, pinned once in conf/deltabus.conf,
``[delta-spark] package``) and their runtime dependencies, in a directory of `cache_dir` (the
checkout's git-ignored ``build/delta-jars``). The first call fetches them; later calls only
look. They go to Spark as ``--jars`` (``spark.jars``), which also ships them to executors.

How they are fetched, in order:

1. Spark's own resolver: ``spark-submit --packages <package>`` on a script that does nothing,
   with an Ivy settings file of one resolver, Maven's central repository at Ivy's built-in
   default address. Spark's default Ivy settings also consult ``~/.m2/repository`` first, and
   measured here that failed the whole resolution: ``mvn dependency:get`` had left POMs of
   some dependencies there without their jars ("download failed: slf4j-api.jar").
2. The machine's ``mvn``, when Spark's resolver cannot reach a registry but Maven (with its
   own settings: mirrors, proxies) can: ``dependency:copy-dependencies`` on a small generated
   POM, runtime scope, without ``org.scala-lang`` and ``org.apache.spark`` (Spark has its own,
   and a second scala-library on the classpath is a conflict). It yields the same jars.

Why a cache rather than ``--packages`` on every run: one resolution costs a JVM start and a
look at the registry (≈ 3 s here); the cached jars cost nothing and work offline.
Nothing here writes a registry's address: the machine's configuration and the tools' own
defaults decide where jars come from.

Contract: a cache directory is complete or absent. Jars are fetched into a temporary
directory beside it and renamed into place, so concurrent first calls (test processes,
spark-submit runs) each end with the same complete directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..errors import FailedPrecondition, InvalidArgument

EXTENSIONS = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
# The two static SQL settings delta-spark needs on the session (MERGE and the DeltaTable API
# refuse to run without them), as spark-submit --conf pairs.
SESSION_CONFS: Mapping[str, str] = {"spark.sql.extensions": EXTENSIONS, "spark.sql.catalog.spark_catalog": CATALOG}
FETCH_TIMEOUT = 600.0  # seconds: a first download on a slow link, not a hang

_PART = re.compile(r"^[A-Za-z0-9_.\-]+$")

IVY_SETTINGS = """<ivysettings>
  <!-- One resolver: Maven's central repository at Ivy's default address (see delta_jars.py). -->
  <settings defaultResolver="central"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true"/>
  </resolvers>
</ivysettings>
"""

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.deltabus</groupId>
  <artifactId>delta-jars</artifactId>
  <version>0</version>
  <dependencies>
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


@dataclass(frozen=True, slots=True)
class Package:
    """A Maven coordinate ``group:artifact:version``."""

    group: str
    artifact: str
    version: str

    def __post_init__(self) -> None:
        for part in (self.group, self.artifact, self.version):
            if not _PART.match(part):
                raise InvalidArgument("[delta-spark] package", f"must be group:artifact:version of letters, digits, '.', '_' or '-', got {str(self)!r}")

    @classmethod
    def parse(cls, raw: str, field: str = "[delta-spark] package") -> "Package":
        parts = raw.strip().split(":")
        if len(parts) != 3 or not all(parts):
            raise InvalidArgument(field, f"must be group:artifact:version (e.g. io.delta:delta-spark_4.1_2.13:4.4.0), got {raw!r}")
        try:
            return cls(*parts)
        except InvalidArgument as e:
            raise InvalidArgument(field, e.rule) from None

    def __str__(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def dirname(self) -> str:
        return f"{self.group}_{self.artifact}-{self.version}"


class FetchFailed(Exception):
    """One way of fetching did not work; the message says why, in one line."""


def cached(package: Package, cache_dir: str | os.PathLike[str]) -> list[Path] | None:
    """The jars of `package` in `cache_dir`, or None when they were never fetched there."""
    where = Path(cache_dir) / package.dirname
    if not where.is_dir():
        return None
    jars = sorted(where.glob("*.jar"))
    return jars or None


def resolve(
    package: Package,
    cache_dir: str | os.PathLike[str],
    *,
    spark_submit: str | None,
    mvn: str | None = "mvn",
    env: Mapping[str, str] | None = None,
    timeout: float = FETCH_TIMEOUT,
) -> list[Path]:
    """The jars of `package` and its runtime dependencies, fetched into `cache_dir` on first use.

    `spark_submit`: Spark's spark-submit (None skips Spark's resolver); `mvn`: Maven's
    command (None skips it); `env`: their environment (default: this process's). Raises
    ``FailedPrecondition`` naming ``[delta-spark] package`` and each way's reason when none works.
    """
    jars = cached(package, cache_dir)
    if jars is not None:
        return jars
    root = Path(cache_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    reasons: list[str] = []
    ways = [("Spark's resolver (--packages)", spark_submit, _via_spark), ("mvn", mvn, _via_mvn)]
    for label, tool, fetch in ways:
        if tool is None:
            continue
        tool = os.path.abspath(shutil.which(tool) or tool)  # the fetch runs in a temporary directory
        with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as tmp:
            out = Path(tmp) / "jars"
            out.mkdir()
            try:
                fetch(package, tool, Path(tmp), out, env, timeout)
            except FetchFailed as e:
                reasons.append(f"{label}: {e}")
                continue
            if not any(out.glob("*.jar")):
                reasons.append(f"{label}: fetched no jar")
                continue
            try:
                os.rename(out, root / package.dirname)
            except OSError:
                if cached(package, root) is None:  # not a concurrent fetch that won the rename
                    raise
        found = cached(package, root)
        assert found is not None
        return found
    tried = "; ".join(reasons) or "no way to fetch was given (no spark-submit, no mvn)"
    raise FailedPrecondition(f"[delta-spark] package: could not fetch {package} and its dependencies: {tried}")


def pinned_jars(cache_dir: str | os.PathLike[str], python: str, env: Mapping[str, str]) -> list[Path]:
    """The jars of the package pinned in the settings file (``[delta-spark] package``), fetched
    once into `cache_dir` with the spark-submit beside `python` (a venv's interpreter), which
    also runs Spark's Python; `env` is the rest of its environment. For programs that build
    their own SparkSession (the tests, the bench's pullers) instead of using spark-submit.sh."""
    from .. import config

    package = Package.parse(config.delta_package(config.default_path()))
    spark_env = {**env, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    return resolve(package, cache_dir, spark_submit=str(Path(python).parent / "spark-submit"), env=spark_env)


def _run(cmd: Sequence[str], cwd: Path, env: Mapping[str, str] | None, timeout: float) -> None:
    try:
        proc = subprocess.run(list(cmd), cwd=cwd, env=None if env is None else dict(env), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise FetchFailed(f"{cmd[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise FetchFailed(f"gave up after {timeout:g} s") from None
    if proc.returncode != 0:
        raise FetchFailed(_why(proc.stdout + "\n" + proc.stderr) or f"exit code {proc.returncode}")


def _why(output: str) -> str:
    """The line of a failed resolution that says what failed (Ivy's or Maven's), shortened."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for needle in ("unresolved dependency", "download failed", "[ERROR]", "Exception"):
        for ln in lines:
            if needle in ln:
                return ln[:300]
    return lines[-1][:300] if lines else ""


def _via_spark(package: Package, spark_submit: str, tmp: Path, out: Path, env: Mapping[str, str] | None, timeout: float) -> None:
    settings = tmp / "ivysettings.xml"
    settings.write_text(IVY_SETTINGS)
    noop = tmp / "noop.py"
    noop.write_text("")  # spark-submit resolves --packages before it runs anything
    ivy = tmp / "ivy"
    _run(
        [spark_submit, "--master", "local[1]", "--packages", str(package),
         "--conf", f"spark.jars.ivySettings={settings}", "--conf", f"spark.jars.ivy={ivy}", str(noop)],
        tmp, env, timeout,
    )
    for jar in (ivy / "jars").glob("*.jar"):
        shutil.move(str(jar), out / jar.name)


def _via_mvn(package: Package, mvn: str, tmp: Path, out: Path, env: Mapping[str, str] | None, timeout: float) -> None:
    (tmp / "pom.xml").write_text(POM.format(group=package.group, artifact=package.artifact, version=package.version))
    _run(
        [mvn, "-q", "-B", "-f", str(tmp / "pom.xml"), "dependency:copy-dependencies", f"-DoutputDirectory={out}",
         "-DincludeScope=runtime", "-DexcludeGroupIds=org.scala-lang,org.apache.spark"],
        tmp, env, timeout,
    )


def submit_args(jars: Sequence[Path], given: Mapping[str, str] | None = None) -> list[str]:
    """spark-submit options that put `jars` on the classpath (driver and executors) and
    configure the session for Delta, leaving alone any setting in `given` (the user's own)."""
    given = given or {}
    args = ["--jars", ",".join(str(j) for j in jars)]
    for key, value in SESSION_CONFS.items():
        if key not in given:
            args += ["--conf", f"{key}={value}"]
    return args


# spark-submit's options that take a value (SparkSubmitOptionParser), so the application
# (the first other argument) is found without mistaking `--jars x.jar` for it.
_VALUED = frozenset({
    "--master", "--remote", "--deploy-mode", "--class", "--name", "--jars", "--packages", "--exclude-packages",
    "--repositories", "--py-files", "--files", "--archives", "--conf", "-c", "--properties-file", "--driver-memory",
    "--driver-java-options", "--driver-library-path", "--driver-class-path", "--executor-memory", "--proxy-user",
    "--driver-cores", "--total-executor-cores", "--executor-cores", "--num-executors", "--queue", "--principal",
    "--keytab", "--kill", "--status",
})


@dataclass(frozen=True, slots=True)
class SubmitLine:
    """A spark-submit command line split at the application: Spark's options, then the rest."""

    options: tuple[str, ...]
    application: tuple[str, ...]  # the .py / .jar and its own arguments

    @classmethod
    def split(cls, args: Sequence[str]) -> "SubmitLine":
        i = 0
        while i < len(args):
            a = args[i]
            if a in _VALUED:
                i += 2
                continue
            if a.startswith("-"):
                i += 1
                continue
            break
        return cls(tuple(args[:i]), tuple(args[i:]))

    def values(self, option: str) -> list[str]:
        """Every value given to `option` (``--opt v`` and ``--opt=v``)."""
        out, opts = [], self.options
        for i, a in enumerate(opts):
            if a == option and i + 1 < len(opts):
                out.append(opts[i + 1])
            elif a.startswith(option + "="):
                out.append(a[len(option) + 1:])
        return out

    def confs(self) -> dict[str, str]:
        pairs = self.values("--conf") + self.values("-c")
        return dict(p.split("=", 1) for p in pairs if "=" in p)

    def engine(self) -> str | None:
        """The application's ``--engine`` flag, if it has one."""
        app = self.application
        for i, a in enumerate(app):
            if a == "--engine" and i + 1 < len(app):
                return app[i + 1]
            if a.startswith("--engine="):
                return a.split("=", 1)[1]
        return None


def has_delta(line: SubmitLine) -> bool:
    """Whether the command line already brings delta-spark (``--packages`` or ``--jars``)."""
    confs = line.confs()
    given = line.values("--packages") + line.values("--jars") + [confs.get("spark.jars.packages", ""), confs.get("spark.jars", "")]
    return any("delta-spark" in g for g in given)


def plan_submit(args: Sequence[str], engine_setting: str, *, jars: Callable[[], list[Path]] | None, ivy_settings: Path) -> list[str]:
    """`args` (spark-submit's, application included) with what the delta-spark engine needs.

    - The job asks for delta-spark (its ``--engine delta-spark``, or no ``--engine`` and
      `engine_setting` is delta-spark) and the line brings no Delta: the cached jars
      (`jars()`, fetched on first use) join ``--jars``, and the session settings are added.
      `jars` None: the cluster has Delta on its classpath already; only the settings are added.
    - The line brings Delta itself (``--packages io.delta:delta-spark…`` or ``--jars``): the
      session settings are added, and for ``--packages`` our Ivy settings (`ivy_settings`),
      unless the user gave their own (see the module docstring: the default ones failed here).
    - Otherwise (delta-rs, auto without Delta): `args` unchanged.
    A setting the user gave (``--conf k=v``) is never replaced.
    """
    line = SubmitLine.split(args)
    given = line.confs()
    wanted = line.engine() or engine_setting
    extra: list[str] = []
    options = list(line.options)
    if has_delta(line):
        if (line.values("--packages") or "spark.jars.packages" in given) and "spark.jars.ivySettings" not in given:
            ivy_settings.parent.mkdir(parents=True, exist_ok=True)
            if not ivy_settings.exists() or ivy_settings.read_text() != IVY_SETTINGS:
                ivy_settings.write_text(IVY_SETTINGS)
            extra += ["--conf", f"spark.jars.ivySettings={ivy_settings}"]
    elif wanted == "delta-spark":
        if jars is not None:
            found = [str(j) for j in jars()]
            user_jars = line.values("--jars")
            if user_jars:  # spark-submit keeps only the last --jars: merge them into one
                options = _without(options, "--jars")
                found = [*user_jars, *found]
            extra += ["--jars", ",".join(found)]
    else:
        return list(args)
    for key, value in SESSION_CONFS.items():
        if key not in given:
            extra += ["--conf", f"{key}={value}"]
    return [*options, *extra, *line.application]


def _without(options: Sequence[str], option: str) -> list[str]:
    out: list[str] = []
    skip = False
    for a in options:
        if skip:
            skip = False
            continue
        if a == option:
            skip = True
            continue
        if a.startswith(option + "="):
            continue
        out.append(a)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line for scripts (``python -m deltabus.spark.delta_jars``):

    - ``jars --cache DIR --spark-submit PATH``: fetch if needed; print the jars, comma-separated.
    - ``submit-args --cache DIR --spark-submit PATH [--no-fetch] -- ARGS…``: print spark-submit's
      ARGS with what the delta-spark engine needs (``plan_submit``), NUL-separated, for
      spark-submit.sh.

    The package comes from conf/deltabus.conf's ``[delta-spark]`` section, the engine from the
    settings (conf/deltabus.conf, DELTABUS_<NAME>).
    """
    import argparse
    import sys

    from .. import config
    from ..errors import DeltabusError

    p = argparse.ArgumentParser(prog="python -m deltabus.spark.delta_jars")
    p.add_argument("command", choices=["jars", "submit-args"])
    p.add_argument("--cache", required=True, help="the jar cache directory (build/delta-jars)")
    p.add_argument("--spark-submit", help="Spark's spark-submit, for Spark's own resolver")
    p.add_argument("--no-fetch", action="store_true", help="submit-args: Delta is on the cluster's classpath; add only the session settings")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args, rest = p.parse_args(argv[:cut]), argv[cut + 1:]
    try:
        # spark-submit finds its Spark through PYSPARK_PYTHON (scripts/bootstrap.sh exports it).
        # The package is read only when jars are fetched: a delta-rs job needs no [delta-spark].
        def fetch() -> list[Path]:
            package = Package.parse(config.delta_package(config.default_path()))
            return resolve(package, args.cache, spark_submit=args.spark_submit)

        if args.command == "jars":
            print(",".join(str(j) for j in fetch()))
        else:
            out = plan_submit(rest, _engine_setting(rest), jars=None if args.no_fetch else fetch,
                              ivy_settings=Path(args.cache) / "ivysettings.xml")
            sys.stdout.write("".join(a + "\0" for a in out))
    except DeltabusError as e:
        print(f"deltabus: {e}", file=sys.stderr)
        return 1
    return 0


def _engine_setting(args: Sequence[str]) -> str:
    """The engine the job's settings name: its own ``--conf FILE`` (deltabus's flag, after the
    application), else conf/deltabus.conf, each under DELTABUS_<NAME>. Settings that do not
    load count as "auto": the job itself reports them, in its own words."""
    from .. import config
    from ..errors import DeltabusError

    app = SubmitLine.split(args).application
    path: str | None = None
    for i, a in enumerate(app):
        if a == "--conf" and i + 1 < len(app):
            path = app[i + 1]
        elif a.startswith("--conf="):
            path = a.split("=", 1)[1]
    try:
        return config.load(path or config.default_path()).engine
    except DeltabusError:
        return "auto"


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
