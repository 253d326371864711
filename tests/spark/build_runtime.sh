#!/usr/bin/env bash
# Build (once) and cache a working Iceberg Spark runtime for PySpark 3.5,
# without Maven access: only PyPI and Debian's apt mirrors are used.
#
#   * pip (into the CURRENT python environment):
#       pyspark==3.5.*                       -> Spark itself + Jackson 2.15 jars
#       snowpark-connect-deps-iceberg==1.0.3 -> iceberg-spark-runtime-3.5_2.12-1.10.2.jar
#   * apt (Debian stable):  libjarjar-java   -> the relocation tool
#   * apt-get download from Debian unstable (private apt state, nothing
#     installed): libhttpclient5-java libhttpcore5-java (need >= 5.4)
#
# The runtime jar in that wheel lacks two of the dependencies it relocates;
# we re-create them with jarjar:
#   com.fasterxml.jackson.** -> org.apache.iceberg.shaded.com.fasterxml.jackson.**
#   org.apache.hc.**         -> org.apache.iceberg.shaded.org.apache.hc.**
# (META-INF/versions/* and module-info are dropped from the inputs, Jackson's
# META-INF/services files are renamed/rewritten to the relocated names.)
#
# Output dir: ${SPARK_ICEBERG_JARS:-$HOME/.cache/coordinator/spark-iceberg-jars}
# holding the jars plus build-info.json (versions + sha256 of each jar). When
# that marker verifies, the build is skipped (only pyspark is ensured).
# tests/spark/session.py reads the marker.
#
# Environment knobs:
#   SPARK_ICEBERG_JARS   output dir (see above)
#   PYTHON               python to pip-install into (default: python, else python3)
#   DEBIAN_MIRROR        Debian mirror for the sid download (default: read
#                        from /etc/apt/sources.list{,.d/*})
#   FORCE_REBUILD=1      ignore the cache
#
# Prints the jar dir as its last line on success.
set -euo pipefail

RECIPE=1
ICEBERG_VERSION=1.10.2
SNOWPARK_DEPS_VERSION=1.0.3
PYSPARK_SPEC='pyspark==3.5.*'
RUNTIME_JAR="iceberg-spark-runtime-3.5_2.12-${ICEBERG_VERSION}.jar"
SHADE_PREFIX=org.apache.iceberg.shaded

OUT="${SPARK_ICEBERG_JARS:-$HOME/.cache/coordinator/spark-iceberg-jars}"
MARKER="$OUT/build-info.json"
START=$SECONDS

log() { printf '[build_runtime %3ds] %s\n' "$((SECONDS - START))" "$*" >&2; }
die() {
    printf '\n[build_runtime] FAILED: %s\n' "$1" >&2
    shift
    for hint in "$@"; do printf '[build_runtime]   -> %s\n' "$hint" >&2; done
    exit 1
}

if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
elif command -v python >/dev/null 2>&1; then
    PY=python
elif command -v python3 >/dev/null 2>&1; then
    PY=python3
else
    die "no python found" "activate the venv you want pyspark in, or set PYTHON=/path/to/python"
fi
PY="$(command -v "$PY")" || die "PYTHON=$PYTHON is not executable"

if [[ $(id -u) -eq 0 ]]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo -n)
else
    SUDO=()
fi

# --------------------------------------------------------------------------
# helpers

apt_has_candidate() {  # apt_has_candidate PKG -> 0 when the stable lists know it
    local out
    out="$(apt-cache policy "$1" 2>/dev/null || true)"  # (no `| grep -q`: SIGPIPE + pipefail)
    [[ $out == *"Candidate: "[0-9]* ]]
}

apt_install() {  # apt_install PKG...
    local missing=()
    for p in "$@"; do
        [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" == "install ok installed" ]] || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    if [[ $(id -u) -ne 0 && ${#SUDO[@]} -eq 0 ]]; then
        die "need root to apt-get install ${missing[*]}" "run: sudo apt-get install -y ${missing[*]}  (then re-run this script)"
    fi
    log "apt-get install ${missing[*]}"
    if ! apt_has_candidate "${missing[0]}"; then
        log "apt-get update (no candidate for ${missing[0]} in the apt lists)"
        "${SUDO[@]}" apt-get update -qq || die "apt-get update failed" "check network access to the Debian mirror"
    fi
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed" "run 'apt-get update && apt-get install -y ${missing[*]}' by hand to see why"
}

ensure_pyspark() {
    local v
    v="$("$PY" -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null || true)"
    if [[ "$v" == 3.5.* ]]; then
        log "pyspark $v already installed in $PY"
        return 0
    fi
    log "pip install $PYSPARK_SPEC into $PY (found: ${v:-none}; first time takes ~1-2 min, it is a 300 MB sdist)"
    "$PY" -m pip install -q "$PYSPARK_SPEC" \
        || die "pip install $PYSPARK_SPEC failed" "run '$PY -m pip install \"$PYSPARK_SPEC\"' by hand to see why"
}

# Verify the cached set: marker present, recipe/pinned versions match, every
# jar present with the recorded sha256. Prints nothing, exit 0 when good.
cache_ok() {
    [[ -f "$MARKER" ]] || return 1
    "$PY" - "$OUT" "$RECIPE" "$ICEBERG_VERSION" "$SNOWPARK_DEPS_VERSION" <<'PYEOF'
import hashlib, json, os, sys
out, recipe, iceberg, deps = sys.argv[1:]
try:
    info = json.load(open(os.path.join(out, "build-info.json")))
    assert info["recipe"] == int(recipe)
    assert info["iceberg"] == iceberg and info["snowpark_connect_deps_iceberg"] == deps
    assert info["pyspark"].startswith("3.5.")
    assert len(info["jars"]) >= 3
    for j in info["jars"]:
        h = hashlib.sha256()
        with open(os.path.join(out, j["name"]), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        assert h.hexdigest() == j["sha256"], j["name"]
except Exception as e:  # noqa: BLE001 - any problem means "rebuild"
    print(f"cache invalid: {type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(1)
PYEOF
}

# --------------------------------------------------------------------------
# 0. cache

command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
JAVA_MAJOR="$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')"
[[ "${JAVA_MAJOR%%.*}" =~ ^(11|17)$ ]] \
    || log "WARNING: java specification $JAVA_MAJOR; Spark 3.5 is tested with Java 11/17"

mkdir -p "$OUT" || die "cannot create $OUT" "set SPARK_ICEBERG_JARS to a writable directory"
# Serialise concurrent runs (e.g. parallel test workers) on the same cache.
exec 9>"$OUT/.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi

if [[ "${FORCE_REBUILD:-0}" != 1 ]] && cache_ok; then
    log "cached jar set in $OUT verifies (build-info.json); skipping the build"
    ensure_pyspark
    log "done"
    echo "$OUT"
    exit 0
fi

# --------------------------------------------------------------------------
# 1. installs

log "building the Iceberg Spark runtime jar set into $OUT"
ensure_pyspark
log "pip install snowpark-connect-deps-iceberg==$SNOWPARK_DEPS_VERSION into $PY"
"$PY" -m pip install -q "snowpark-connect-deps-iceberg==$SNOWPARK_DEPS_VERSION" \
    || die "pip install snowpark-connect-deps-iceberg==$SNOWPARK_DEPS_VERSION failed" \
           "run '$PY -m pip install snowpark-connect-deps-iceberg==$SNOWPARK_DEPS_VERSION' by hand to see why"

apt_install libjarjar-java
JARJAR=/usr/share/java/jarjar.jar
[[ -f $JARJAR ]] || die "libjarjar-java is installed but $JARJAR is missing" "reinstall: apt-get install --reinstall libjarjar-java"

PYSPARK_VERSION="$("$PY" -c 'import pyspark; print(pyspark.__version__)')"
PYSPARK_JARS="$("$PY" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
DEPS_JARS="$("$PY" -c 'import snowpark_connect_deps_iceberg as m; print(m.get_jars_dir())')"
[[ -f "$DEPS_JARS/$RUNTIME_JAR" ]] || die "$RUNTIME_JAR not found in $DEPS_JARS" \
    "the snowpark-connect-deps-iceberg wheel layout changed; pin it to $SNOWPARK_DEPS_VERSION"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/build_runtime.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# --------------------------------------------------------------------------
# 2. httpclient5/httpcore5 >= 5.4 from Debian unstable (private apt state)

find_mirror() {
    local f line uri
    if [[ -n "${DEBIAN_MIRROR:-}" ]]; then echo "$DEBIAN_MIRROR"; return; fi
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] || continue
        while read -r uri; do
            # the main archive, not debian-security / ports / third-party repos
            if [[ $uri =~ /debian/?$ ]]; then echo "${uri%/}"; return; fi
        done < <(
            sed -n -e 's/^[[:space:]]*deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' \
                   -e 's/^[[:space:]]*URIs:[[:space:]]*//p' "$f" | tr ' ' '\n'
        )
    done
    echo "http://deb.debian.org/debian"
}

MIRROR="$(find_mirror)"
log "downloading libhttpclient5-java libhttpcore5-java from $MIRROR sid (private apt state in $WORK/apt)"
A="$WORK/apt"
mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$A/debs" "$A/x"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
echo "deb [signed-by=$KEYRING] $MIRROR sid main" > "$A/sources.list"
APT_OPTS=(
    -o "Dir::Etc::sourcelist=$A/sources.list"
    -o "Dir::Etc::sourceparts=-"
    -o "Dir::State::Lists=$A/lists"
    -o "Dir::Cache=$A/cache"
    -o "APT::Get::List-Cleanup=0"
    -o "Acquire::Languages=none"
)
# apt drops privileges to _apt for downloads; our private dirs are root-only.
[[ $(id -u) -eq 0 ]] && APT_OPTS+=(-o "APT::Sandbox::User=root")
apt-get "${APT_OPTS[@]}" -qq update >"$WORK/apt-update.log" 2>&1 || {
    cat "$WORK/apt-update.log" >&2
    die "apt-get update of the private sid sources failed" \
        "check that $MIRROR is reachable and serves 'sid' (override with DEBIAN_MIRROR=...)"
}
# apt-get update exits 0 when a source is unreachable (it only warns)
compgen -G "$A/lists/*_Packages*" >/dev/null || {
    cat "$WORK/apt-update.log" >&2
    die "apt-get update of the private sid sources fetched no package list" \
        "check that $MIRROR is reachable and serves 'sid' (override with DEBIAN_MIRROR=...)"
}
(cd "$A/debs" && apt-get "${APT_OPTS[@]}" -qq download libhttpclient5-java libhttpcore5-java) >"$WORK/apt-download.log" 2>&1 || {
    cat "$WORK/apt-download.log" >&2
    die "apt-get download libhttpclient5-java libhttpcore5-java (sid) failed" \
        "check that $MIRROR is reachable (override with DEBIAN_MIRROR=...)"
}
for deb in "$A"/debs/*.deb; do dpkg -x "$deb" "$A/x"; done
HC_DEB_VERSION="$(dpkg-deb -f "$A"/debs/libhttpclient5-java_*.deb Version)"
CORE_DEB_VERSION="$(dpkg-deb -f "$A"/debs/libhttpcore5-java_*.deb Version)"
J="$A/x/usr/share/java"
HC_JAR="$(ls "$J"/httpclient5-5*.jar 2>/dev/null | grep -E '/httpclient5-[0-9.]+\.jar$' | head -1 || true)"
CORE_JAR="$(ls "$J"/httpcore5-5*.jar 2>/dev/null | grep -E '/httpcore5-[0-9.]+\.jar$' | head -1 || true)"
H2_JAR="$(ls "$J"/httpcore5-h2-5*.jar 2>/dev/null | grep -E '/httpcore5-h2-[0-9.]+\.jar$' | head -1 || true)"
[[ -n $HC_JAR && -n $CORE_JAR && -n $H2_JAR ]] || die "httpclient5/httpcore5/httpcore5-h2 jars not found in the sid packages" \
    "inspect: dpkg -c $A/debs/*.deb (package layout changed?)"
HC_VERSION="$(basename "$HC_JAR" .jar)"; HC_VERSION="${HC_VERSION#httpclient5-}"
CORE_VERSION="$(basename "$CORE_JAR" .jar)"; CORE_VERSION="${CORE_VERSION#httpcore5-}"
"$PY" -c 'import sys; v=tuple(int(x) for x in sys.argv[1].split(".")[:2]); sys.exit(0 if (5,4) <= v < (6,0) else 1)' "$HC_VERSION" \
    || die "sid has httpclient5 $HC_VERSION; the Iceberg 1.10 REST client needs 5.4 <= version < 6" \
           "adapt the recipe in tests/spark/build_runtime.sh"
log "got httpclient5 $HC_VERSION (deb $HC_DEB_VERSION), httpcore5 $CORE_VERSION (deb $CORE_DEB_VERSION)"

# --------------------------------------------------------------------------
# 3. relocate with jarjar

# merge.py OUT FROM_PREFIX TO_PREFIX IN.jar... : one jar, without
# META-INF/versions/*, module-info, manifests and signatures; service files
# whose name/entries start with FROM_PREFIX are renamed/rewritten to TO_PREFIX
# (jarjar relocates classes and resources but not META-INF/services).
cat > "$WORK/merge.py" <<'PYEOF'
import sys, zipfile
out, src, dst, *inputs = sys.argv[1:]
seen = set()
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zo:
    for path in inputs:
        with zipfile.ZipFile(path) as zi:
            for info in zi.infolist():
                name = info.filename
                if info.is_dir() or name.startswith("META-INF/versions/") or name.endswith("module-info.class"):
                    continue
                if name == "META-INF/MANIFEST.MF" or (
                    name.startswith("META-INF/") and name.upper().endswith((".SF", ".RSA", ".DSA", ".EC"))
                ):
                    continue
                data = zi.read(name)
                if name.startswith("META-INF/services/"):
                    svc = name[len("META-INF/services/"):]
                    if svc.startswith(src):
                        name = "META-INF/services/" + dst + svc[len(src):]
                    lines = []
                    for line in data.decode("utf-8").splitlines():
                        s = line.strip()
                        lines.append(dst + s[len(src):] if s.startswith(src) else line)
                    data = ("\n".join(lines) + "\n").encode("utf-8")
                if name in seen:
                    continue
                seen.add(name)
                zo.writestr(name, data)
PYEOF

relocate() {  # relocate OUT.jar FROM_PKG TO_PKG IN.jar...
    local out="$1" from="$2" to="$3"; shift 3
    local base; base="$(basename "$out" .jar)"
    "$PY" "$WORK/merge.py" "$WORK/$base-in.jar" "$from." "$to." "$@" \
        || die "merging inputs for $base failed" "see the python traceback above"
    echo "rule $from.** $to.@1" > "$WORK/$base.rules"
    # jarjar exits 0 even on errors ("Syntax error: Duplicate jar entries"):
    # judge by its output and by the jar it writes.
    if ! java -jar "$JARJAR" process "$WORK/$base.rules" "$WORK/$base-in.jar" "$out" >"$WORK/$base.log" 2>&1 \
        || grep -qiE 'error|exception' "$WORK/$base.log" || [[ ! -s "$out" ]]; then
        cat "$WORK/$base.log" >&2
        die "jarjar failed for $base" "see its output above"
    fi
}

STAGE="$(mktemp -d "$OUT/.staging.XXXXXX")"
trap 'rm -rf "$WORK" "$STAGE"' EXIT

JACKSON_IN=()
JACKSON_VERSION=
for a in core databind annotations datatype-jsr310; do
    jar="$(ls "$PYSPARK_JARS" | grep -E "^jackson-$a-2\.[0-9]+\.[0-9]+\.jar$" | head -1 || true)"
    [[ -n $jar ]] || die "jackson-$a 2.x jar not found in $PYSPARK_JARS" "is pyspark 3.5 installed correctly in $PY?"
    JACKSON_IN+=("$PYSPARK_JARS/$jar")
    [[ $a == core ]] && { JACKSON_VERSION="${jar#jackson-core-}"; JACKSON_VERSION="${JACKSON_VERSION%.jar}"; }
done
JACKSON_OUT="iceberg-shaded-jackson-$JACKSON_VERSION.jar"
HC_OUT="iceberg-shaded-httpclient5-$HC_VERSION.jar"

log "relocating Jackson $JACKSON_VERSION (pyspark's jars) -> $SHADE_PREFIX.com.fasterxml.jackson"
relocate "$STAGE/$JACKSON_OUT" com.fasterxml.jackson "$SHADE_PREFIX.com.fasterxml.jackson" "${JACKSON_IN[@]}"
log "relocating httpclient5 $HC_VERSION + httpcore5 $CORE_VERSION (+h2) -> $SHADE_PREFIX.org.apache.hc"
relocate "$STAGE/$HC_OUT" org.apache.hc "$SHADE_PREFIX.org.apache.hc" "$HC_JAR" "$CORE_JAR" "$H2_JAR"

cp "$DEPS_JARS/$RUNTIME_JAR" "$STAGE/$RUNTIME_JAR"
# (the wheel's iceberg-spark-extensions jar is not needed: the runtime jar
# already contains every extensions class; its scala-collection-compat 2.13
# is not needed either: pyspark ships scala-collection-compat 2.7.)

# --------------------------------------------------------------------------
# 4. verify: every class the runtime jar references under the two relocated
# prefixes exists in the new jars, and nothing in them still points at the
# unrelocated packages.

log "verifying class references"
"$PY" - "$STAGE/$RUNTIME_JAR" "$STAGE/$JACKSON_OUT" "$STAGE/$HC_OUT" <<'PYEOF' || die "verification of the relocated jars failed" "see the list above; the recipe needs fixing"
import re, sys, zipfile
runtime, *extra = sys.argv[1:]
ref = re.compile(rb"org/apache/iceberg/shaded/(?:com/fasterxml/jackson|org/apache/hc)/[A-Za-z0-9_/$]*[A-Za-z0-9_]")
# internal (slash) names only: dotted ones also occur in messages / maven coordinates
raw = re.compile(rb"(?<!shaded/)(?:com/fasterxml/jackson|org/apache/hc)/")
have, bad = set(), []
for path in extra:
    with zipfile.ZipFile(path) as z:
        for n in z.namelist():
            if n.endswith(".class"):
                have.add(n[:-6])
                if raw.search(z.read(n)):
                    bad.append(f"{path}: {n} still references an unrelocated class")
wanted = set()
with zipfile.ZipFile(runtime) as z:
    for n in z.namelist():
        if n.endswith(".class") and not n.startswith("META-INF/"):
            wanted.update(m.decode() for m in ref.findall(z.read(n)))
# a referenced name may also be a package (e.g. in a string): accept it when classes live under it
pkgs = {h.rsplit("/", 1)[0] for h in have}
missing = sorted(w for w in wanted if w not in have and w not in pkgs)
for line in bad[:20] + [f"missing: {m}" for m in missing[:50]]:
    print(line, file=sys.stderr)
print(f"{len(wanted)} referenced relocated classes, {len(missing)} missing, {len(bad)} unrelocated refs", file=sys.stderr)
sys.exit(1 if missing or bad or not wanted else 0)
PYEOF

# --------------------------------------------------------------------------
# 5. publish: replace what the old marker listed, then write the marker last

if [[ -f "$MARKER" ]]; then
    "$PY" -c 'import json,sys; [print(j["name"]) for j in json.load(open(sys.argv[1]))["jars"]]' "$MARKER" 2>/dev/null \
        | while read -r old; do [[ -n $old && $old != */* ]] && rm -f "$OUT/$old"; done || true
    rm -f "$MARKER"
fi
for jar in "$RUNTIME_JAR" "$JACKSON_OUT" "$HC_OUT"; do mv -f "$STAGE/$jar" "$OUT/$jar"; done

"$PY" - "$OUT" "$RECIPE" "$ICEBERG_VERSION" "$SNOWPARK_DEPS_VERSION" "$PYSPARK_VERSION" "$JACKSON_VERSION" \
    "$HC_DEB_VERSION" "$CORE_DEB_VERSION" "$MIRROR" "$RUNTIME_JAR" "$JACKSON_OUT" "$HC_OUT" <<'PYEOF' \
    || die "writing $MARKER failed" "check that $OUT is writable"
import datetime, hashlib, json, os, sys
out, recipe, iceberg, deps, pyspark, jackson, hc, core, mirror, *jars = sys.argv[1:]
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
info = {
    "recipe": int(recipe),
    "iceberg": iceberg,
    "snowpark_connect_deps_iceberg": deps,
    "pyspark": pyspark,
    "jackson": jackson,
    "httpclient5_deb": hc,
    "httpcore5_deb": core,
    "debian_mirror": mirror,
    "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "spark_conf": {
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
    },
    "jars": [{"name": j, "sha256": sha(os.path.join(out, j))} for j in jars],
}
tmp = os.path.join(out, "build-info.json.tmp")
with open(tmp, "w") as f:
    json.dump(info, f, indent=2)
    f.write("\n")
os.replace(tmp, os.path.join(out, "build-info.json"))
PYEOF

log "done: $RUNTIME_JAR $JACKSON_OUT $HC_OUT"
echo "$OUT"
