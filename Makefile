# tidelog: `make demo` runs the main job, `make test` the whole suite. Both set up .venv themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo demo-cluster test check-install system-deps client-deps java bench-peers lint typecheck lint-imports crash-long test-cluster-faults test-rocketmq-ha-long bench bench-append bench-produce bench-read bench-recovery bench-broker bench-spark bench-spark-sink bench-compaction bench-engines bench-partitions bench-admin-stall bench-replication bench-rocketmq-ha bench-transactions bench-rocketmq-reads crash-transactions-long fuzz-long fuzz-asan soak-long docs-config docs-compat docs-clients clean

# the install compiles codec/_rocketmq_rebuild.c and storage/common/_positioned_writes.c (optional to pip; here a
# compiler is installed if there is none)
$(STAMP): pyproject.toml src/tidelog/codec/_rocketmq_rebuild.c src/tidelog/storage/common/_positioned_writes.c
	@command -v cc >/dev/null 2>&1 || { echo "installing Debian package gcc (the compiled RocketMQ paths)"; \
	  $(call APT_INSTALL,gcc); }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench,spark,fuzz]'
	touch $(STAMP)

demo: $(STAMP) java
	$(VENV)/bin/tidelog demo

# the same pipeline on ZooKeeper and three brokers, the leader of a partition killed mid-stream (docs/cluster.md)
demo-cluster: $(STAMP) system-deps java
	$(VENV)/bin/tidelog demo --cluster

# Debian packages: kcat for the client tests, openssl for tests/security, ZooKeeper for tests/cluster, a Java
# runtime for Spark and ZooKeeper.
# Installed once, as root or through sudo.
APT_INSTALL = SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	$$SUDO apt-get install -y -q $(1) >/dev/null 2>&1 || \
	{ $$SUDO apt-get update -q >/dev/null 2>&1 && $$SUDO apt-get install -y -q $(1) >/dev/null; }

system-deps:
	@command -v kcat >/dev/null 2>&1 || { echo "installing Debian package kcat"; $(call APT_INSTALL,kcat); }
	@command -v openssl >/dev/null 2>&1 || { echo "installing Debian package openssl (TLS test certificates)"; \
	  $(call APT_INSTALL,openssl); }
	@[ -f /usr/share/java/zookeeper.jar ] || { echo "installing Debian package zookeeper (tests/cluster)"; \
	  $(call APT_INSTALL,zookeeper); }

# The clients of tests/clients beside the Python ones: KafkaJS 2.2.4 and its codec packages (npm ci from the
# committed package-lock.json into tests/clients/js/node_modules, ignored by git) on Debian's Node, and Sarama 1.22
# from Debian (GOPATH mode under /usr/share/gocode) with Go; the tests compile the Go program themselves.
client-deps:
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || \
	  { echo "installing Debian packages nodejs and npm (KafkaJS tests)"; $(call APT_INSTALL,nodejs npm); }
	@command -v go >/dev/null 2>&1 && [ -d /usr/share/gocode/src/github.com/Shopify/sarama ] || \
	  { echo "installing Debian packages golang-go and golang-github-shopify-sarama-dev (Sarama tests)"; \
	    $(call APT_INSTALL,golang-go golang-github-shopify-sarama-dev); }
	@cmp -s tests/clients/js/package-lock.json tests/clients/js/node_modules/.installed-lock.json || \
	  { echo "installing KafkaJS into tests/clients/js/node_modules (npm ci)"; \
	    cd tests/clients/js && npm ci --no-audit --no-fund --loglevel=error >/dev/null && \
	    cp package-lock.json node_modules/.installed-lock.json; }

java:
	@command -v java >/dev/null 2>&1 || { echo "Spark needs Java: installing openjdk-17-jre-headless"; \
	  $(call APT_INSTALL,openjdk-17-jre-headless); }
	@java -version 2>&1 | head -1

test: $(STAMP) system-deps client-deps java check-install
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(PY) -m pytest -q --durations=20 tests -m "not slow"; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$status

# `pip install .` alone (no extras) in a fresh venv in a temp dir: `tidelog serve` with a librdkafka producer and
# consumer, the embedded API, then `pip install '.[spark]'` and the data source's imports (tests/install/).
check-install:
	PYTHON=$(PYTHON) tests/install/check_install.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples

# mypy over src, as pyproject.toml's [tool.mypy] configures it; part of `test`.
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# the layer contracts in .importlinter (engines independent, the broker only through storage/api.py); part of `test`.
lint-imports: $(STAMP)
	$(VENV)/bin/lint-imports

# the long variants of the crash suites (tests/crash, marker `slow`): 100 kill -9 trials, 1,000 torn-write trials
crash-long: $(STAMP)
	$(PY) -m pytest -q -s -m slow tests/crash

# exactly once through kill -9 (tests/crash/test_transactions_kill9.py, marker `slow`): a consume-transform-produce
# loop and the broker killed 60 times in turn (about 3 minutes); part of crash-long too
crash-transactions-long: $(STAMP)
	$(PY) -m pytest -q -s -m slow tests/crash/test_transactions_kill9.py

# the long cluster fault suite (tests/cluster, marker `slow`): the leader killed with SIGKILL 100 times under load
test-cluster-faults: $(STAMP) system-deps java
	$(PY) -m pytest -q -s -m slow tests/cluster

# RocketMQ master/slave groups: the master killed with SIGKILL 100 times (tests/cluster/test_rocketmq_ha.py; another
# count with TIDELOG_ROCKETMQ_HA_KILLS=N)
test-rocketmq-ha-long: $(STAMP) system-deps java
	$(PY) -m pytest -q -s -m slow tests/cluster/test_rocketmq_ha.py

bench: bench-append bench-produce bench-read bench-recovery bench-broker bench-spark bench-spark-sink bench-compaction \
	bench-engines bench-partitions bench-admin-stall bench-replication bench-rocketmq-ha bench-transactions \
	bench-rocketmq-reads

bench-append: $(STAMP)
	$(PY) bench/append_throughput.py

bench-produce: $(STAMP)
	$(PY) bench/produce_records.py

bench-read: $(STAMP)
	$(PY) bench/random_reads.py

bench-recovery: $(STAMP)
	$(PY) bench/recovery_scan.py

# the peers and compiled clients of the broker benchmark: Redis (redis-benchmark), NATS, kcat, Go with nats.go
bench-peers: system-deps
	@command -v redis-benchmark >/dev/null 2>&1 && command -v nats-server >/dev/null 2>&1 && \
	  command -v go >/dev/null 2>&1 && [ -d /usr/share/gocode/src/github.com/nats-io/nats.go ] || \
	  { echo "installing Debian packages for the broker benchmark's peers"; \
	    $(call APT_INSTALL,redis-server redis-tools nats-server golang-go golang-github-nats-io-go-nats-dev); }

bench-broker: $(STAMP) bench-peers
	$(PY) bench/broker_vs_peers.py

bench-spark: $(STAMP)
	$(PY) bench/spark_read.py

bench-spark-sink: $(STAMP)
	$(PY) bench/spark_sink.py

bench-engines: $(STAMP)
	$(PY) bench/engine_partitions.py --plot

# 20,000 partitions (200 topics x 100) on one broker, Kafka engine: create, produce, consume, clean and kill -9 restarts
bench-partitions: $(STAMP)
	$(PY) bench/partitions_broker.py

# heartbeat round trips while CreateTopics/CreatePartitions/DeleteTopics of 2,000 partitions run; writes its docs section
bench-admin-stall: $(STAMP)
	$(PY) bench/admin_stall.py --write-report

# three brokers and ZooKeeper: acks=all rf3 vs rf1, latency at 10k msg/s, kill -9 failover, controlled shutdown;
# writes its docs section (needs Debian's zookeeper package: make system-deps)
bench-replication: $(STAMP) system-deps java
	$(PY) bench/replication.py --write-report

# RocketMQ master/slave groups: SYNC_MASTER and ASYNC_MASTER produce throughput as shares of a lone master, the
# slave's lag under full load, failover time from kill -9 of the master (prints its figures; bench/README.md)
bench-rocketmq-ha: $(STAMP) system-deps java
	$(PY) bench/rocketmq_ha.py

# Coverage-guided fuzzing (atheris), 1,000,000 inputs per target; figures in docs/reliability.md.
fuzz-long: $(STAMP)
	$(PY) tests/fuzz/run.py --runs 1000000

# The RocketMQ read target with the compiled rebuild under AddressSanitizer and UBSan, after the tests of the compiled
# positioned writes built the same way (tests/fuzz/asan.sh).
fuzz-asan: $(STAMP)
	PY=$(PY) tests/fuzz/asan.sh

# Soak: 200+ client connections against one broker for 10 minutes; memory, descriptors and every record checked.
soak-long: $(STAMP)
	$(PY) -m pytest -q -s -m slow tests/soak/test_soak.py::test_soak_long

# one broker: transactional vs idempotent produce, read_committed vs read_uncommitted; writes its docs section
bench-transactions: $(STAMP)
	$(PY) bench/transactions.py --write-report

# consuming from the RocketMQ engine against the Kafka engine, embedded and through the broker (docs/benchmarks.md)
bench-rocketmq-reads: $(STAMP)
	$(PY) bench/rocketmq_reads.py --write-report

bench-compaction: $(STAMP)
	$(PY) bench/compaction.py

# docs/configuration.md from the config key tables (tests/unit/test_configuration_doc.py checks it is current)
docs-config: $(STAMP)
	$(PY) -m tidelog.tools.config_reference --output docs/configuration.md

# the "API versions" section of docs/compatibility.md, from the broker's handler table
docs-compat: $(STAMP)
	$(PY) -m tidelog.tools.api_versions --output docs/compatibility.md

# the "Clients" section of docs/compatibility.md: runs tests/clients (KafkaJS, Sarama) and writes each outcome
docs-clients: $(STAMP) client-deps
	$(PY) tests/client_matrix.py --doc docs/compatibility.md

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .hypothesis tidelog-demo-data tests/clients/js/node_modules
