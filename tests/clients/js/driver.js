// KafkaJS 2.2.4 driven by tests/clients/test_kafkajs.py: one long-lived process per test module.
//
// Usage: node driver.js BOOTSTRAP
// Reads one JSON request per line on stdin, {"op": ..., ...}, and answers each with one JSON line on stdout:
// {"ok": true, "result": ...} or {"ok": false, "error": {"name", "type", "code", "message", "retriable"}}.
// Requests run one after another. KafkaJS's own log lines go to stderr.
//
//   admin        {method, args}: admin[method](...args) on one connected admin client
//   produce      {topic, messages, compression, idempotent, acks}: one producer per request, one send
//   transaction  {transactionalId, topic, messages, commit}: a transactional producer's send, then commit (or abort
//                when `commit` is false), at KafkaJS's default retry settings
//   consumerStart {name, groupId, topics, fromBeginning, sessionTimeout, rebalanceTimeout, readUncommitted}: a
//                group member that keeps every message it is given and commits after each batch (KafkaJS's
//                autoCommit); it reads committed records only (KafkaJS's default) unless `readUncommitted`
//   consumerSeek {name, topic, partition, offset}
//   consumerTake {name, topic, count, timeoutMs}: waits until `count` messages of `topic` are kept (or the
//                timeout), returns and forgets them
//   consumerState {name}: how often it joined, its member id, whether it leads, its assigned partitions
//                (from the last GROUP_JOIN)
//   consumerStop {name}: disconnect (leaves the group)
//
// Values and keys travel as UTF-8 strings; header values as arrays of strings (KafkaJS gives a repeated header
// key as an array).
'use strict'

const readline = require('readline')
const { Kafka, CompressionTypes, CompressionCodecs, logLevel } = require('kafkajs')
const SnappyCodec = require('kafkajs-snappy')
const LZ4Codec = require('@2l/kafkajs-lz4')
const { ZstdCodec } = require('zstd-codec')

const bootstrap = process.argv[2]
process.env.KAFKAJS_NO_PARTITIONER_WARNING = '1' // the v2 default partitioner (murmur2, Java's) is the one wanted

// KafkaJS has GZIP built in; the other codecs are plugins registered by the application.
CompressionCodecs[CompressionTypes.Snappy] = SnappyCodec
CompressionCodecs[CompressionTypes.LZ4] = new LZ4Codec().codec
const zstdReady = new Promise(resolve => ZstdCodec.run(zstd => resolve(new zstd.Simple())))
CompressionCodecs[CompressionTypes.ZSTD] = () => ({
  compress: async encoder => Buffer.from((await zstdReady).compress(encoder.buffer)),
  decompress: async buffer => Buffer.from((await zstdReady).decompress(buffer)),
})

const CODECS = {
  none: CompressionTypes.None,
  gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy,
  lz4: CompressionTypes.LZ4,
  zstd: CompressionTypes.ZSTD,
}

const stderrLog = () => ({ namespace, level, log }) => {
  process.stderr.write(`[kafkajs ${level}] ${namespace}: ${log.message} ${JSON.stringify(log)}\n`)
}

const kafka = new Kafka({
  clientId: 'tidelog-kafkajs-tests',
  brokers: [bootstrap],
  logLevel: logLevel.WARN,
  logCreator: stderrLog,
  retry: { retries: 3, initialRetryTime: 100, maxRetryTime: 1000 },
})

let admin = null
const consumers = new Map()

function describeError (error) {
  return {
    name: error.name,
    type: error.type || null,
    code: error.code === undefined ? null : error.code,
    message: error.message,
    retriable: error.retriable === undefined ? null : error.retriable,
    errors: Array.isArray(error.errors) ? error.errors.map(describeError) : null,
    cause: error.cause ? describeError(error.cause) : null,
    partitions: Array.isArray(error.partitions)
      ? error.partitions.map(p => ({ partition: p.partition, error: p.error ? describeError(p.error) : null }))
      : null,
  }
}

function headersOut (headers) {
  const out = {}
  for (const [key, value] of Object.entries(headers || {})) {
    out[key] = (Array.isArray(value) ? value : [value]).map(v => (v === null ? null : v.toString()))
  }
  return out
}

async function adminCall ({ method, args = [] }) {
  if (admin === null) {
    admin = kafka.admin()
    await admin.connect()
  }
  return admin[method](...args)
}

async function produce ({ topic, messages, compression = 'none', idempotent = false, acks = -1 }) {
  const producer = kafka.producer({ idempotent, maxInFlightRequests: idempotent ? 1 : undefined })
  await producer.connect()
  try {
    return await producer.send({ topic, messages, acks, compression: CODECS[compression] })
  } finally {
    await producer.disconnect()
  }
}

async function transaction ({ transactionalId, topic, messages, commit = true }) {
  // a client of KafkaJS's default retry settings: how long it keeps trying is what the broker's answer decides
  const defaults = new Kafka({ clientId: 'tidelog-kafkajs-tests', brokers: [bootstrap], logCreator: stderrLog })
  const producer = defaults.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 })
  await producer.connect()
  try {
    const txn = await producer.transaction()
    await txn.send({ topic, messages })
    return await (commit ? txn.commit() : txn.abort())
  } finally {
    await producer.disconnect()
  }
}

async function consumerStart ({
  name, groupId, topics, fromBeginning = true, sessionTimeout, rebalanceTimeout, readUncommitted = false,
}) {
  const consumer = kafka.consumer({
    groupId,
    readUncommitted,
    sessionTimeout: sessionTimeout || 6000,
    rebalanceTimeout: rebalanceTimeout || 6000,
    heartbeatInterval: 500,
    maxWaitTimeInMs: 200,
    retry: { retries: 3 },
  })
  const state = { consumer, kept: [], joins: [], waiters: [], crashed: null }
  consumers.set(name, state)
  consumer.on(consumer.events.GROUP_JOIN, event => state.joins.push(event.payload))
  consumer.on(consumer.events.CRASH, event => { state.crashed = describeError(event.payload.error) })
  await consumer.connect()
  for (const topic of topics) await consumer.subscribe({ topic, fromBeginning })
  await consumer.run({
    eachMessage: async ({ topic, partition, message }) => {
      state.kept.push({
        topic,
        partition,
        offset: Number(message.offset),
        key: message.key === null ? null : message.key.toString(),
        value: message.value === null ? null : message.value.toString(),
        headers: headersOut(message.headers),
      })
      for (const wake of state.waiters.splice(0)) wake()
    },
  })
  return true
}

function member (name) {
  const state = consumers.get(name)
  if (!state) throw new Error(`no consumer named ${name}`)
  return state
}

async function consumerTake ({ name, topic, count, timeoutMs = 20000 }) {
  const state = member(name)
  const deadline = Date.now() + timeoutMs
  const ofTopic = () => state.kept.filter(m => m.topic === topic)
  while (ofTopic().length < count && Date.now() < deadline && state.crashed === null) {
    await new Promise(resolve => {
      state.waiters.push(resolve)
      setTimeout(resolve, Math.max(0, Math.min(200, deadline - Date.now())))
    })
  }
  const taken = ofTopic().slice(0, count)
  state.kept = state.kept.filter(m => !taken.includes(m))
  return { messages: taken, crashed: state.crashed }
}

function consumerState ({ name }) {
  const state = member(name)
  const last = state.joins[state.joins.length - 1] || null
  return {
    joins: state.joins.length,
    memberId: last && last.memberId,
    isLeader: last ? last.isLeader : null,
    assignment: last ? last.memberAssignment : {},
    crashed: state.crashed,
  }
}

async function consumerSeek ({ name, topic, partition, offset }) {
  member(name).consumer.seek({ topic, partition, offset: String(offset) })
  return true
}

async function consumerStop ({ name }) {
  const state = member(name)
  consumers.delete(name)
  await state.consumer.disconnect()
  return { left: state.kept.length }
}

const OPS = { admin: adminCall, produce, transaction, consumerStart, consumerTake, consumerState, consumerSeek, consumerStop }

function reply (answer) {
  process.stdout.write(JSON.stringify(answer, (key, value) => (typeof value === 'bigint' ? value.toString() : value)) + '\n')
}

async function main () {
  const lines = readline.createInterface({ input: process.stdin })
  for await (const line of lines) {
    if (!line.trim()) continue
    const request = JSON.parse(line)
    try {
      const op = OPS[request.op]
      if (!op) throw new Error(`unknown op ${request.op}`)
      const result = await op(request)
      reply({ ok: true, result: result === undefined ? null : result })
    } catch (error) {
      reply({ ok: false, error: describeError(error) })
    }
  }
  for (const state of consumers.values()) await state.consumer.disconnect()
  if (admin !== null) await admin.disconnect()
}

main().then(() => process.exit(0), error => {
  process.stderr.write(`driver failed: ${error.stack}\n`)
  process.exit(1)
})
