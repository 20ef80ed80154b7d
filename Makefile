# `make run`: install embedlog alone (no extra), build it and run the main job (embedlog demo)
# on the embedded default: seconds on a fresh machine, not minutes of PySpark.
# `make test`: install what the tests need (every extra, ZooKeeper, etcd, chromium) and run them.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS := test,bench,zk,etcd,spark

.PHONY: run test test-asan build build-ext build-floor venv venv-core servers peers bench soak soak-pulsar soak-tests clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip 'setuptools>=77' wheel 'cython>=3.0' 'numpy>=2.0'

# The editable install builds no Cython module (EMBEDLOG_NO_EXT=1): build-ext builds them
# once, one job per core, and later runs rebuild only what changed. editable_mode=compat
# puts the source tree on sys.path with a .pth line, which mypy follows (setuptools'
# default editable finder is an import hook that mypy cannot see).
INSTALL := EMBEDLOG_NO_EXT=1 $(BIN)/pip install --no-build-isolation --config-settings editable_mode=compat

# what the embedded demo needs: the core dependencies of pyproject.toml, no extra
venv-core: $(BIN)/python
	$(INSTALL) -e .

# everything the tests, benchmarks and tools need
venv: $(BIN)/python
	$(INSTALL) -e '.[$(EXTRAS)]'

build-ext: $(BIN)/python
	$(BIN)/python setup.py build_ext --inplace

# the benchmarks' floor (benchmarks/floor.pyx): only compare.py needs it
build-floor: $(BIN)/python
	$(BIN)/python benchmarks/compare.py --build-floor

build: venv build-ext build-floor

run: venv-core build-ext
	$(BIN)/embedlog demo --entries $${ENTRIES:-1000000}

# Debian's ZooKeeper 3.8 and etcd 3.4 run as children of the tests (never as services);
# Debian's chromium loads the status page headless in tests/admin/test_status_page.py; clang
# builds the Cython modules with coverage hooks for the fuzzer (tests/shared/test_fuzz.py)
servers:
	@if ! dpkg -s zookeeper etcd-server etcd-client chromium clang >/dev/null 2>&1; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=600 \
	    zookeeper etcd-server etcd-client chromium clang; fi
	@# Java 17 for the Spark tests (tests/spark), only when no java is on the PATH
	@if ! command -v java >/dev/null 2>&1; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=600 \
	    openjdk-17-jre-headless; fi
	@# Maven fetches the Java peers' jars (make peers), only when no mvn is on the PATH
	@if ! command -v mvn >/dev/null 2>&1; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=600 \
	    maven; fi

# the Java peers' jars (BookKeeper, Kafka, Spark's Kafka connector) from Maven Central into
# ~/.cache/embedlog/peers (embedlog/harness/peers/jars.py); tests and benchmarks run them as children
peers: servers venv build-ext
	$(BIN)/python -m embedlog.harness.peers.jars

# the suite and, beside it, the tests that touch native code again under ASan + UBSan
# (tools/sanitize.py builds an instrumented copy in build/asan and runs it there, with a base
# temp of its own; a sanitizer report fails the run). Side by side, not one after the other:
# the suite leaves much of the second core idle while it waits on bookies, JVMs and fdatasync,
# and the two runs share no file. The sanitizer's output follows the suite's.
test: servers venv build-ext peers
	@mkdir -p build
	$(BIN)/python tools/sanitize.py > build/sanitize.log 2>&1 & san=$$!; \
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 $(PYTEST_ARGS); rc=$$?; \
	wait $$san; src=$$?; \
	echo "--- tools/sanitize.py (ASan + UBSan), run beside the suite: exit $$src"; \
	cat build/sanitize.log; \
	test $$rc -eq 0 -a $$src -eq 0

test-asan: venv
	$(BIN)/python tools/sanitize.py $(PYTEST_ARGS)

bench: venv build-ext build-floor
	$(BIN)/python benchmarks/compare.py

soak: venv build-ext
	$(BIN)/python tools/crash_soak.py --cycles $${CYCLES:-1000}

# a Pulsar broker on embedlog bookies, the whole matrix: subscription types, rollovers,
# compaction, schemas, the broker SIGKILLed, deletion, BookKeeper's auditor (~8 min)
soak-pulsar: servers venv build-ext peers
	$(BIN)/python -m pytest -q -p no:cacheprovider -m soak tests/interop/test_pulsar_matrix.py

# every test marked soak: the Pulsar matrix, the Spark standalone cluster killed and
# restarted, the Kafka and Spark side-by-side checks (~15 min)
soak-tests: servers venv build-ext peers
	$(BIN)/python -m pytest -q -p no:cacheprovider -m soak

clean:
	rm -rf build $(VENV) embedlog/_native/*.so pyx/embedlog/_native/*.c
