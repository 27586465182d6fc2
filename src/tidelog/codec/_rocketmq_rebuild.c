/* CommitLog messages back into Kafka v2 batches in one compiled pass: the fast path of
 * codec/rocketmq_batches.py (see its docstring for the contract; this file follows it message for message).
 *
 * rebuild(data, positions, sizes, first_offset, max_bytes, min_one_message, at_end)
 *     -> None | (batches: bytes | None, next_offset: int, missing: int, full: bool)
 *
 * `data` is any contiguous buffer of bytes, `positions` and `sizes` contiguous buffers of int64 (one per message,
 * the ConsumeQueue units made relative to `data`). The result is what rocketmq_batches._rebuild returns for the
 * whole run, with every batch that goes out back to back in one bytes object (None: no batch). None instead of a
 * result means "not here": the run has something this pass does not decode - a damaged message or KAFKA_BATCH
 * value, a key or headers in base64 (KAFKA_KEY64, KAFKA_HEADERS64), two entries of one read or user name,
 * PROPERTIES over `properties_width` bytes, a KAFKA_PRODUCER value that is not four plain integers - and the
 * caller rebuilds it the numpy way, which names what is wrong or handles it. So this pass never raises for bad
 * input, and whatever it returns equals the numpy rebuild byte for byte (tests/unit/test_rocketmq_batches.py).
 *
 * configure(names, roles, crc32c, properties_width) is called once, by rocketmq_batches at import: the reserved
 * property names (bytes) with what each means to a rebuild (ROLE_* below), the CRC-32C function (crc32c.crc32c)
 * and the longest PROPERTIES decoded here. The parse and the encoding run without the GIL; the CRC of each batch
 * is the one call back into Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* the roles a reserved name can have; the order is rocketmq_batches.COMPILED_ROLES' */
enum { ROLE_IGNORED, ROLE_KEYS, ROLE_NULL_VALUE, ROLE_BATCH, ROLE_PRODUCER, ROLE_FALLBACK, ROLE_USER };
#define READ_ROLES 4 /* KEYS, NULL_VALUE, BATCH, PRODUCER: a value each, at most one entry each */

/* the RocketMQ message header (codec/rocketmq_message.py) */
#define FIXED_SIZE 88
#define MIN_MESSAGE_SIZE (FIXED_SIZE + 3)
#define MAGIC_V1 ((int32_t)0xDAA320A7)
#define MAGIC_V2 ((int32_t)0xDAA320AB)
#define AT_FLAG 16
#define AT_QUEUE_OFFSET 20
#define AT_SYS_FLAG 36
#define AT_BORN_TIMESTAMP 40
#define SYSFLAG_BORNHOST_V6 0x10
#define SYSFLAG_STOREHOST_V6 0x20

/* the Kafka v2 batch (codec/record_batch.py) */
#define HEADER_SIZE 61
#define CRC_AT 17
#define ATTRIBUTES_AT 21
#define TXN_ATTRIBUTES 0x30 /* transactional | control */
#define NO_SEQUENCE (-1)
#define SEQUENCE_MODULUS (INT64_C(1) << 31)
#define BATCH_DIGITS 24
#define BATCH_NUMBER_DIGITS 18
#define MAX_PAIRWISE_HEADERS 32 /* more user properties than this in one message: left to numpy's duplicate check */

typedef struct {
    const uint8_t *name;
    Py_ssize_t length;
    int role;
} Reserved;

static Reserved *reserved;
static Py_ssize_t reserved_count;
static PyObject *crc_function;
static int64_t properties_width;

typedef struct {
    int64_t at, length; /* into data; length -1: absent */
} Span;

typedef struct {
    int64_t born;
    int32_t flag;
    Span body, key, null_value, batch, producer; /* null_value: KAFKA_NULL_VALUE (present: a null value) */
    int64_t header_first, header_count; /* into the run's header table */
} Message;

typedef struct {
    Span name, value;
} Header;

typedef struct {
    Message *messages;
    Header *headers;
    int64_t header_used, header_room;
} Run;

static inline int32_t be32(const uint8_t *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

static inline int64_t be64(const uint8_t *p) {
    return (int64_t)(((uint64_t)(uint32_t)be32(p) << 32) | (uint32_t)be32(p + 4));
}

static inline int16_t be16(const uint8_t *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }

static inline uint8_t *put_be32(uint8_t *out, uint32_t v) {
    out[0] = (uint8_t)(v >> 24), out[1] = (uint8_t)(v >> 16), out[2] = (uint8_t)(v >> 8), out[3] = (uint8_t)v;
    return out + 4;
}

static inline uint8_t *put_be64(uint8_t *out, uint64_t v) {
    put_be32(out, (uint32_t)(v >> 32));
    return put_be32(out + 4, (uint32_t)v);
}

static inline uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

static inline int64_t varint_size(uint64_t v) {
    int64_t size = 1;
    while (v >= 0x80) v >>= 7, size++;
    return size;
}

static inline uint8_t *put_varint(uint8_t *out, uint64_t v) {
    while (v >= 0x80) *out++ = (uint8_t)(v | 0x80), v >>= 7;
    *out++ = (uint8_t)v;
    return out;
}

static int role_of(const uint8_t *name, int64_t length) {
    for (Py_ssize_t i = 0; i < reserved_count; i++)
        if (reserved[i].length == length && memcmp(reserved[i].name, name, (size_t)length) == 0) return reserved[i].role;
    return ROLE_USER;
}

static int add_header(Run *run, Span name, Span value) {
    if (run->header_used == run->header_room) {
        int64_t room = run->header_room ? 2 * run->header_room : 256;
        Header *grown = realloc(run->headers, (size_t)room * sizeof(Header));
        if (!grown) return 0;
        run->headers = grown, run->header_room = room;
    }
    run->headers[run->header_used++] = (Header){name, value};
    return 1;
}

/* One message's PROPERTIES as string_to_properties reads them: entries split on \x02 (an unterminated last one
 * ends with the PROPERTIES), each on its first \x01; an entry needs a non-empty name and value. 0: not here. */
static int parse_properties(Run *run, Message *m, const uint8_t *data, int64_t at, int64_t length) {
    Span *read[READ_ROLES] = {&m->key, &m->null_value, &m->batch, &m->producer}; /* by role, from ROLE_KEYS */
    m->header_first = run->header_used;
    int64_t end = at + length, start = at;
    while (start < end) {
        const uint8_t *stop = memchr(data + start, 2, (size_t)(end - start));
        int64_t entry_end = stop ? stop - data : end;
        const uint8_t *split = memchr(data + start, 1, (size_t)(entry_end - start));
        if (split && split - data > start && split - data < entry_end - 1) {
            Span name = {start, split - data - start}, value = {split - data + 1, entry_end - (split - data) - 1};
            int role = role_of(data + name.at, name.length);
            if (role == ROLE_FALLBACK) return 0;
            if (role == ROLE_USER) {
                if (!add_header(run, name, value)) return -1;
            } else if (role != ROLE_IGNORED) {
                Span *cell = read[role - ROLE_KEYS];
                if (cell->length >= 0) return 0; /* two entries of one read name */
                *cell = value;
            }
        }
        start = entry_end + 1;
    }
    m->header_count = run->header_used - m->header_first;
    if (m->header_count > MAX_PAIRWISE_HEADERS) return 0;
    const Header *h = run->headers + m->header_first;
    for (int64_t i = 0; i < m->header_count; i++)
        for (int64_t j = i + 1; j < m->header_count; j++)
            if (h[i].name.length == h[j].name.length &&
                memcmp(data + h[i].name.at, data + h[j].name.at, (size_t)h[i].name.length) == 0)
                return 0; /* two user properties of one name */
    return 1;
}

/* A message's header fields and properties (rocketmq_batches._parse's checks; any failure: 0, not here). */
static int parse_message(Run *run, Message *m, const uint8_t *data, int64_t data_length, int64_t position,
                         int64_t size, int64_t queue_offset) {
    if (size < MIN_MESSAGE_SIZE || position < 0 || position > data_length - size) return 0;
    const uint8_t *p = data + position;
    int32_t magic = be32(p + 4);
    if (be32(p) != size || (magic != MAGIC_V1 && magic != MAGIC_V2)) return 0;
    if (be64(p + AT_QUEUE_OFFSET) != queue_offset) return 0;
    m->flag = be32(p + AT_FLAG);
    m->born = be64(p + AT_BORN_TIMESTAMP);
    int32_t sys_flag = be32(p + AT_SYS_FLAG);
    int64_t body_at = FIXED_SIZE + ((sys_flag & SYSFLAG_BORNHOST_V6) ? 12 : 0) + ((sys_flag & SYSFLAG_STOREHOST_V6) ? 12 : 0);
    if (body_at + 3 > size) return 0;
    int64_t body_length = be32(p + body_at - 4);
    int v2 = magic == MAGIC_V2, topic_field = v2 ? 2 : 1;
    if (body_length < 0 || body_at + body_length + topic_field + 2 > size) return 0;
    int64_t body_end = body_at + body_length;
    int64_t topic_length = v2 ? be16(p + body_end) : p[body_end];
    int64_t properties_length_at = body_end + topic_field + topic_length;
    if (topic_length < 0 || properties_length_at + 2 > size) return 0;
    int64_t properties_at = properties_length_at + 2, properties_length = size - properties_at;
    if (be16(p + properties_length_at) != properties_length || properties_length > properties_width) return 0;
    m->body = (Span){position + body_at, body_length};
    m->key = m->null_value = m->batch = m->producer = (Span){-1, -1};
    return parse_properties(run, m, data, position + properties_at, properties_length);
}

/* A KAFKA_BATCH value `index/count` (rocketmq_batches._batch_value's rule); 0: not one. */
static int batch_value(const uint8_t *text, int64_t length, int64_t *index, int64_t *count) {
    if (length > BATCH_DIGITS) return 0;
    int64_t numbers[2] = {0, 0}, digits[2] = {0, 0};
    int part = 0;
    for (int64_t i = 0; i < length; i++) {
        uint8_t c = text[i];
        if (c == '/' && part == 0) {
            part = 1;
        } else if (c >= '0' && c <= '9' && digits[part] < BATCH_NUMBER_DIGITS) {
            numbers[part] = numbers[part] * 10 + (c - '0'), digits[part]++;
        } else {
            return 0;
        }
    }
    if (part != 1 || !digits[0] || !digits[1] || numbers[0] >= numbers[1]) return 0;
    *index = numbers[0], *count = numbers[1];
    return 1;
}

/* KAFKA_PRODUCER `<producer id>/<epoch>/<base sequence>/<count>`: four integers (an optional minus and 1-18
 * digits each; parse_producer_info takes more, which the numpy rebuild handles); 0: not that. */
static int producer_value(const uint8_t *text, int64_t length, int64_t parts[4]) {
    int64_t part = 0, digits = 0, number = 0;
    int negative = 0;
    for (int64_t i = 0; i <= length; i++) {
        if (i == length || text[i] == '/') {
            if (!digits || part > 3) return 0;
            parts[part++] = negative ? -number : number;
            number = digits = negative = 0;
        } else if (text[i] == '-' && !digits && !negative) {
            negative = 1;
        } else if (text[i] >= '0' && text[i] <= '9' && digits < BATCH_NUMBER_DIGITS) {
            number = number * 10 + (text[i] - '0'), digits++;
        } else {
            return 0;
        }
    }
    return part == 4 && parts[1] >= INT16_MIN && parts[1] <= INT16_MAX && parts[2] >= INT32_MIN && parts[2] <= INT32_MAX;
}

typedef struct {
    int64_t groups, *group_end; /* batches of messages [group_end[g-1], group_end[g]) */
    int64_t *record_body;       /* per message in a batch: its record's bytes after the length varint */
    int64_t *batch_size;
    int64_t *producer;          /* per batch: producer id, epoch, base sequence, attributes (4 each) */
    int64_t next_offset_rel, missing, fits;
    int full, empty_full;       /* empty_full: no batch, and the open one cannot fit */
} Plan;

/* Which messages end their batch, and that every batch has the messages its KAFKA_BATCH counts
 * (rocketmq_batches._batch_ends); 0: not here. ends[] filled, *batch_left of the last message. */
static int batch_ends(const Message *m, int64_t n, const uint8_t *data, uint8_t *ends, int64_t *batch_left) {
    uint8_t *starts = ends + n; /* scratch: the second half of the buffer */
    for (int64_t i = 0; i < n; i++) {
        int64_t length = m[i].batch.length;
        if (length >= 0 && length < 3) return 0; /* no valid value is shorter than 0/1 */
        starts[i] = length < 0 || (data[m[i].batch.at] == '0' && data[m[i].batch.at + 1] == '/');
    }
    starts[0] = 1;
    for (int64_t i = 0; i + 1 < n; i++) ends[i] = m[i].batch.length < 0 || starts[i + 1];
    ends[n - 1] = 1;
    *batch_left = 0;
    int64_t last_index = 0, last_count = 0;
    if (m[n - 1].batch.length >= 0) {
        if (!batch_value(data + m[n - 1].batch.at, m[n - 1].batch.length, &last_index, &last_count)) return 0;
        ends[n - 1] = last_index == last_count - 1;
        *batch_left = last_count - 1 - last_index;
    }
    int64_t next_end = n; /* the first end at or after i, walking back */
    for (int64_t i = n - 1; i >= 0; i--) {
        if (ends[i]) next_end = i;
        if (!starts[i] || m[i].batch.length < 0) continue;
        int64_t index, count;
        if (!batch_value(data + m[i].batch.at, m[i].batch.length, &index, &count)) return 0;
        int64_t size = next_end < n ? next_end + 1 - i : n - i;
        int64_t expected = next_end < n ? count - index : last_index - index + 1;
        if (size != expected) return 0;
    }
    return 1;
}

static void write_batch(uint8_t *out, const Message *m, const Header *headers, const uint8_t *data, int64_t first,
                        int64_t end, int64_t first_offset, int64_t batch_size, const int64_t *record_body,
                        const int64_t producer[4]) {
    int64_t max_timestamp = m[first].born;
    for (int64_t i = first + 1; i < end; i++)
        if (m[i].born > max_timestamp) max_timestamp = m[i].born;
    uint8_t *p = put_be64(out, (uint64_t)(first_offset + first));
    p = put_be32(p, (uint32_t)(batch_size - 12));
    p = put_be32(p, UINT32_MAX); /* partition leader epoch -1 */
    *p++ = 2;                     /* magic */
    p = put_be32(p, 0);           /* CRC: filled in with the GIL */
    *p++ = (uint8_t)(producer[3] >> 8), *p++ = (uint8_t)producer[3]; /* attributes */
    p = put_be32(p, (uint32_t)(end - first - 1));
    p = put_be64(p, (uint64_t)m[first].born);
    p = put_be64(p, (uint64_t)max_timestamp);
    p = put_be64(p, (uint64_t)producer[0]);
    *p++ = (uint8_t)((uint16_t)producer[1] >> 8), *p++ = (uint8_t)producer[1];
    p = put_be32(p, (uint32_t)producer[2]);
    p = put_be32(p, (uint32_t)(end - first));
    for (int64_t i = first; i < end; i++) {
        const Message *r = m + i;
        int64_t value_length = r->null_value.length >= 0 ? -1 : r->body.length;
        int64_t key_length = r->key.length;
        p = put_varint(p, zigzag(record_body[i]));
        *p++ = 0; /* attributes */
        p = put_varint(p, zigzag((int64_t)((uint64_t)r->born - (uint64_t)m[first].born)));
        p = put_varint(p, zigzag(i - first));
        p = put_varint(p, zigzag(key_length));
        if (key_length > 0) memcpy(p, data + r->key.at, (size_t)key_length), p += key_length;
        p = put_varint(p, zigzag(value_length));
        if (value_length > 0) memcpy(p, data + r->body.at, (size_t)value_length), p += value_length;
        p = put_varint(p, zigzag(r->header_count));
        for (int64_t h = r->header_first; h < r->header_first + r->header_count; h++) {
            const Header *header = headers + h;
            p = put_varint(p, zigzag(header->name.length));
            memcpy(p, data + header->name.at, (size_t)header->name.length), p += header->name.length;
            p = put_varint(p, zigzag(header->value.length));
            memcpy(p, data + header->value.at, (size_t)header->value.length), p += header->value.length;
        }
    }
}

/* a record's bytes after its length varint */
static int64_t record_body(const Message *r, const Header *headers, int64_t offset_delta, int64_t timestamp_delta) {
    int64_t value_length = r->null_value.length >= 0 ? -1 : r->body.length;
    int64_t size = 1 + varint_size(zigzag(timestamp_delta)) + varint_size(zigzag(offset_delta)) +
                   varint_size(zigzag(r->key.length)) + varint_size(zigzag(value_length)) +
                   varint_size(zigzag(r->header_count));
    size += (r->key.length > 0 ? r->key.length : 0) + (value_length > 0 ? value_length : 0);
    for (int64_t h = r->header_first; h < r->header_first + r->header_count; h++)
        size += varint_size(zigzag(headers[h].name.length)) + headers[h].name.length +
                varint_size(zigzag(headers[h].value.length)) + headers[h].value.length;
    return size;
}

static PyObject *rebuild(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data_object, *positions_object, *sizes_object;
    long long first_offset, max_bytes;
    int min_one_message, at_end;
    if (!PyArg_ParseTuple(args, "OOOLLpp", &data_object, &positions_object, &sizes_object, &first_offset, &max_bytes,
                          &min_one_message, &at_end))
        return NULL;
    if (!crc_function) return PyErr_Format(PyExc_RuntimeError, "configure() was not called");
    Py_buffer data_view, positions_view, sizes_view;
    if (PyObject_GetBuffer(data_object, &data_view, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(positions_object, &positions_view, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data_view);
        return NULL;
    }
    if (PyObject_GetBuffer(sizes_object, &sizes_view, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data_view), PyBuffer_Release(&positions_view);
        return NULL;
    }
    PyObject *result = NULL;
    const uint8_t *data = data_view.buf;
    const int64_t *positions = positions_view.buf, *sizes = sizes_view.buf;
    int64_t n = positions_view.len / 8;
    Run run = {0};
    Plan plan = {0};
    uint8_t *ends = NULL;
    int outcome = 0; /* 1: rebuilt, 0: not here, -1: out of memory */
    if (positions_view.len != sizes_view.len || positions_view.len % 8 || n == 0) {
        PyErr_SetString(PyExc_ValueError, "positions and sizes must be int64 buffers of one non-zero length");
        goto release;
    }
    Py_BEGIN_ALLOW_THREADS;
    outcome = -1;
    run.messages = malloc((size_t)n * sizeof(Message));
    ends = malloc((size_t)n * 2);
    plan.group_end = malloc((size_t)(n + 1) * sizeof(int64_t));
    plan.record_body = malloc((size_t)n * sizeof(int64_t));
    plan.batch_size = malloc((size_t)(n + 1) * sizeof(int64_t));
    plan.producer = malloc((size_t)(n + 1) * 4 * sizeof(int64_t));
    if (!run.messages || !ends || !plan.group_end || !plan.record_body || !plan.batch_size || !plan.producer)
        goto planned;
    outcome = 0;
    for (int64_t i = 0; i < n; i++) {
        int parsed = parse_message(&run, run.messages + i, data, data_view.len, positions[i], sizes[i], first_offset + i);
        if (parsed <= 0) {
            outcome = parsed;
            goto planned;
        }
    }
    int64_t batch_left;
    if (!batch_ends(run.messages, n, data, ends, &batch_left)) goto planned;
    const Message *m = run.messages;
    for (int64_t i = 0; i < n; i++)
        if (ends[i]) plan.group_end[plan.groups++] = i + 1;
    int64_t open_at_least = 0;
    if (!ends[n - 1]) {
        if (at_end && !(m[n - 1].flag & TXN_ATTRIBUTES)) {
            plan.group_end[plan.groups++] = n; /* handed out as far as it is dispatched */
        } else {
            int64_t open_from = plan.groups ? plan.group_end[plan.groups - 1] : 0;
            plan.missing = n - open_from + batch_left;
            open_at_least = HEADER_SIZE;
            for (int64_t i = open_from; i < n; i++) open_at_least += m[i].body.length;
        }
    }
    outcome = 1;
    if (plan.groups == 0) {
        plan.empty_full = open_at_least > max_bytes && !min_one_message;
        goto planned;
    }
    int64_t total = 0, first = 0;
    plan.fits = -1;
    for (int64_t g = 0; g < plan.groups; first = plan.group_end[g++]) {
        int64_t size = HEADER_SIZE;
        for (int64_t i = first; i < plan.group_end[g]; i++) {
            int64_t timestamp_delta;
            if (__builtin_sub_overflow(m[i].born, m[first].born, &timestamp_delta)) {
                outcome = 0; /* a damaged BORNTIMESTAMP: no record's delta can say it */
                goto planned;
            }
            int64_t body = record_body(m + i, run.headers, i - first, timestamp_delta);
            plan.record_body[i] = body;
            size += varint_size(zigzag(body)) + body;
        }
        plan.batch_size[g] = size;
        total += size;
        if (total > max_bytes && plan.fits < 0) plan.fits = g;
    }
    if (plan.fits < 0) plan.fits = plan.groups;
    if (plan.fits == 0 && min_one_message) plan.fits = 1;
    plan.full = plan.fits < plan.groups || (plan.missing > 0 && total + open_at_least > max_bytes);
    if (plan.full) plan.missing = 0;
    plan.next_offset_rel = plan.fits ? plan.group_end[plan.fits - 1] : 0;
    /* a transactional or control batch's producer (rocketmq_batches._producer); not four integers: not here.
     * Every batch of the run, not only those that fit: the numpy path's short runs read each batch's producer
     * before they weigh it against the budget, and raise for a damaged one even where it would not fit. */
    for (int64_t g = 0, first_of = 0; g < plan.groups; first_of = plan.group_end[g++]) {
        const Message *last = m + plan.group_end[g] - 1;
        int64_t *producer = plan.producer + 4 * g;
        producer[0] = producer[1] = producer[2] = -1, producer[3] = 0; /* none; NO_SEQUENCE */
        if (!(last->flag & TXN_ATTRIBUTES) || last->producer.length < 0) continue;
        int64_t parts[4];
        if (!producer_value(data + last->producer.at, last->producer.length, parts)) {
            outcome = 0;
            goto planned;
        }
        int64_t sequence = parts[2];
        if (sequence != NO_SEQUENCE) { /* a read from inside the batch: its first record's sequence */
            sequence = (sequence + first_of - (plan.group_end[g] - parts[3])) % SEQUENCE_MODULUS;
            if (sequence < 0) sequence += SEQUENCE_MODULUS;
        }
        producer[0] = parts[0], producer[1] = parts[1], producer[2] = sequence;
        producer[3] = last->flag & TXN_ATTRIBUTES;
    }
planned:
    Py_END_ALLOW_THREADS;
    if (outcome < 0) {
        PyErr_NoMemory();
        goto release;
    }
    if (outcome == 0) {
        result = Py_NewRef(Py_None);
        goto release;
    }
    if (plan.groups == 0) {
        result = Py_BuildValue("(OLLO)", Py_None, first_offset, plan.empty_full ? 0LL : (long long)plan.missing,
                               plan.empty_full ? Py_True : Py_False);
        goto release;
    }
    int64_t out_size = 0;
    for (int64_t g = 0; g < plan.fits; g++) out_size += plan.batch_size[g];
    PyObject *out = out_size ? PyBytes_FromStringAndSize(NULL, out_size) : Py_NewRef(Py_None);
    if (!out) goto release;
    if (out_size) {
        uint8_t *buffer = (uint8_t *)PyBytes_AS_STRING(out);
        Py_BEGIN_ALLOW_THREADS;
        uint8_t *at = buffer;
        for (int64_t g = 0, first_of = 0; g < plan.fits; first_of = plan.group_end[g++]) {
            write_batch(at, run.messages, run.headers, data, first_of, plan.group_end[g], first_offset,
                        plan.batch_size[g], plan.record_body, plan.producer + 4 * g);
            at += plan.batch_size[g];
        }
        Py_END_ALLOW_THREADS;
        uint8_t *at = buffer;
        for (int64_t g = 0; g < plan.fits; at += plan.batch_size[g++]) {
            PyObject *covered = PyMemoryView_FromMemory((char *)at + ATTRIBUTES_AT, plan.batch_size[g] - ATTRIBUTES_AT,
                                                        PyBUF_READ);
            PyObject *crc = covered ? PyObject_CallOneArg(crc_function, covered) : NULL;
            Py_XDECREF(covered);
            unsigned long value = crc ? PyLong_AsUnsignedLongMask(crc) : 0;
            Py_XDECREF(crc);
            if (!crc || PyErr_Occurred()) {
                Py_DECREF(out);
                goto release;
            }
            put_be32(at + CRC_AT, (uint32_t)value);
        }
    }
    result = Py_BuildValue("(NLLO)", out, (long long)(first_offset + plan.next_offset_rel), (long long)plan.missing,
                           plan.full ? Py_True : Py_False);
release:
    free(run.messages), free(run.headers), free(ends);
    free(plan.group_end), free(plan.record_body), free(plan.batch_size), free(plan.producer);
    PyBuffer_Release(&data_view), PyBuffer_Release(&positions_view), PyBuffer_Release(&sizes_view);
    return result;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *names, *roles, *crc;
    long long width;
    if (!PyArg_ParseTuple(args, "O!O!OL", &PyTuple_Type, &names, &PyTuple_Type, &roles, &crc, &width)) return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(roles) != count || !PyCallable_Check(crc))
        return PyErr_Format(PyExc_ValueError, "a role for every name, and a callable CRC");
    Reserved *table = PyMem_Calloc((size_t)count + 1, sizeof(Reserved));
    if (!table) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        long role = PyLong_AsLong(PyTuple_GET_ITEM(roles, i));
        if (!PyBytes_Check(name) || role < ROLE_IGNORED || role > ROLE_FALLBACK) {
            PyMem_Free(table);
            return PyErr_Format(PyExc_ValueError, "names are bytes, roles 0-%d", ROLE_FALLBACK);
        }
        Py_INCREF(name); /* kept for the life of the process: the table points into it */
        table[i] = (Reserved){(const uint8_t *)PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), (int)role};
    }
    PyMem_Free(reserved);
    reserved = table, reserved_count = count;
    Py_XSETREF(crc_function, Py_NewRef(crc));
    properties_width = width;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rebuild", rebuild, METH_VARARGS, "The Kafka batches of a run of CommitLog messages, or None (see the module)."},
    {"configure", configure, METH_VARARGS, "The reserved property names and their roles, the CRC, the widest PROPERTIES."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tidelog.codec._rocketmq_rebuild",
    "CommitLog messages back into Kafka v2 batches in one compiled pass (see rocketmq_batches).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rocketmq_rebuild(void) { return PyModule_Create(&module); }
