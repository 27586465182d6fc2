// Sarama 1.22 driven by tests/clients/test_sarama.py: one long-lived process per Kafka version setting.
//
// Usage: driver -bootstrap HOST:PORT [-version 2.2.0]   (no -version: Sarama's default config.Version)
//
// Reads one JSON request per line on stdin, {"op": ..., ...}, and answers each with one JSON line on stdout:
// {"ok": true, "result": ...} or {"ok": false, "error": {"name", "type", "code", "message"}}; "code" is the Kafka
// error code when Sarama hands one back. Requests run one after another; Sarama's log goes to stderr.
//
//	createTopic {topic, partitions, configs, validateOnly}   describeTopics {topics}   listTopics
//	describeConfig {resourceType, name, configNames}         alterConfig {resourceType, name, configs, validateOnly}
//	createPartitions {topic, count}                          deleteRecords {topic, offsets}   deleteTopic {topic}
//	listGroups   describeGroups {groups}   groupOffsets {group, topic, partitions}
//	offsets {topic, partition}: the oldest and newest offsets
//	produce {topic, messages, compression, idempotent}: one SyncProducer per request, one SendMessages
//	consume {topic, partition, offset, count, timeoutMs}: a partition consumer from `offset` (-2 oldest)
//	commit {group, topic, partition, offset}: an OffsetManager marks the offset and closes (which commits)
//	committed {group, topic, partition}: what a new OffsetManager resumes from
//	groupStart {name, group, topics}: a consumer group member keeping every message (and marking it consumed)
//	groupTake {name, count, timeoutMs}   groupState {name}   groupStop {name}: Close (commits, leaves)
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/Shopify/sarama"
)

type Message struct {
	Key     *string
	Value   *string
	Headers [][2]string
}

type Request struct {
	Op           string
	Name         string
	Topic        string
	Topics       []string
	Partitions   []int32
	Partition    int32
	Offset       int64
	Offsets      map[string]int64
	Count        int32
	Configs      map[string]*string
	ConfigNames  []string
	ResourceType string
	ValidateOnly bool
	Groups       []string
	Group        string
	Messages     []Message
	Compression  string
	Idempotent   bool
	TimeoutMs    int
}

type Kept struct {
	Topic     string              `json:"topic"`
	Partition int32               `json:"partition"`
	Offset    int64               `json:"offset"`
	Key       *string             `json:"key"`
	Value     *string             `json:"value"`
	Headers   map[string][]string `json:"headers"`
}

var (
	bootstrap = flag.String("bootstrap", "", "the broker, host:port")
	version   = flag.String("version", "", "config.Version (Kafka version, e.g. 2.2.0); empty: Sarama's default")
	client    sarama.Client
	members   = map[string]*member{}
)

var codecs = map[string]sarama.CompressionCodec{
	"none": sarama.CompressionNone, "gzip": sarama.CompressionGZIP, "snappy": sarama.CompressionSnappy,
	"lz4": sarama.CompressionLZ4, "zstd": sarama.CompressionZSTD,
}

func newConfig() *sarama.Config {
	config := sarama.NewConfig()
	config.ClientID = "tidelog-sarama-tests"
	if *version != "" {
		v, err := sarama.ParseKafkaVersion(*version)
		if err != nil {
			log.Fatal(err)
		}
		config.Version = v
	}
	config.Metadata.Retry.Backoff = 100 * time.Millisecond
	config.Producer.Retry.Backoff = 100 * time.Millisecond
	config.Producer.Return.Successes = true
	config.Producer.RequiredAcks = sarama.WaitForAll
	config.Consumer.Return.Errors = true
	config.Consumer.MaxWaitTime = 200 * time.Millisecond
	config.Consumer.Offsets.Initial = sarama.OffsetOldest
	config.Consumer.Offsets.CommitInterval = 100 * time.Millisecond
	config.Consumer.Group.Session.Timeout = 6 * time.Second
	config.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	config.Consumer.Group.Rebalance.Timeout = 6 * time.Second
	config.Consumer.Group.Rebalance.Retry.Backoff = 200 * time.Millisecond
	return config
}

func describeError(err error) map[string]interface{} {
	out := map[string]interface{}{"name": fmt.Sprintf("%T", err), "message": err.Error(), "code": nil, "type": nil}
	var kerr sarama.KError
	switch e := err.(type) {
	case sarama.KError:
		kerr = e
	case *sarama.TopicError:
		kerr = e.Err
	case *sarama.TopicPartitionError:
		kerr = e.Err
	case *sarama.ProducerError:
		return describeError(e.Err)
	case sarama.ProducerErrors:
		return describeError(e[0])
	case *sarama.ConsumerError:
		return describeError(e.Err)
	default:
		return out
	}
	out["code"] = int16(kerr)
	out["type"] = kerr.Error()
	return out
}

func getClient() (sarama.Client, error) {
	if client == nil {
		c, err := sarama.NewClient([]string{*bootstrap}, newConfig())
		if err != nil {
			return nil, err
		}
		client = c
	}
	return client, client.RefreshMetadata()
}

func resourceType(name string) sarama.ConfigResourceType {
	if name == "broker" {
		return sarama.BrokerResource
	}
	return sarama.TopicResource
}

// adminOp runs one admin call on a ClusterAdmin of its own: Sarama 1.22's admin never reconnects, so a
// connection the broker closed would fail every later call of the module.
func adminOp(r *Request) (interface{}, error) {
	a, err := sarama.NewClusterAdmin([]string{*bootstrap}, newConfig())
	if err != nil {
		return nil, err
	}
	defer a.Close()
	switch r.Op {
	case "createTopic":
		detail := &sarama.TopicDetail{NumPartitions: r.Count, ReplicationFactor: 1, ConfigEntries: r.Configs}
		return true, a.CreateTopic(r.Topic, detail, r.ValidateOnly)
	case "describeTopics":
		metadata, err := a.DescribeTopics(r.Topics)
		if err != nil {
			return nil, err
		}
		out := []map[string]interface{}{}
		for _, topic := range metadata {
			partitions := []map[string]interface{}{}
			for _, p := range topic.Partitions {
				partitions = append(partitions, map[string]interface{}{"id": p.ID, "leader": p.Leader, "error": int16(p.Err)})
			}
			out = append(out, map[string]interface{}{"name": topic.Name, "error": int16(topic.Err), "partitions": partitions})
		}
		return out, nil
	case "listTopics":
		return a.ListTopics()
	case "describeConfig":
		return a.DescribeConfig(sarama.ConfigResource{Type: resourceType(r.ResourceType), Name: r.Name, ConfigNames: r.ConfigNames})
	case "alterConfig":
		return true, a.AlterConfig(resourceType(r.ResourceType), r.Name, r.Configs, r.ValidateOnly)
	case "createPartitions":
		return true, a.CreatePartitions(r.Topic, r.Count, nil, false)
	case "deleteRecords":
		offsets := map[int32]int64{}
		for partition, offset := range r.Offsets {
			p, _ := strconv.Atoi(partition)
			offsets[int32(p)] = offset
		}
		return true, a.DeleteRecords(r.Topic, offsets)
	case "deleteTopic":
		return true, a.DeleteTopic(r.Topic)
	case "listGroups":
		return a.ListConsumerGroups()
	case "describeGroups":
		groups, err := a.DescribeConsumerGroups(r.Groups)
		if err != nil {
			return nil, err
		}
		out := []map[string]interface{}{}
		for _, g := range groups {
			described := map[string]interface{}{}
			for id, m := range g.Members {
				assignment, err := m.GetMemberAssignment()
				if err != nil {
					return nil, err
				}
				described[id] = map[string]interface{}{"clientId": m.ClientId, "assignment": assignment.Topics}
			}
			out = append(out, map[string]interface{}{
				"groupId": g.GroupId, "error": int16(g.Err), "state": g.State, "protocolType": g.ProtocolType,
				"protocol": g.Protocol, "members": described,
			})
		}
		return out, nil
	case "groupOffsets":
		response, err := a.ListConsumerGroupOffsets(r.Group, map[string][]int32{r.Topic: r.Partitions})
		if err != nil {
			return nil, err
		}
		out := map[int32]int64{}
		for _, p := range r.Partitions {
			block := response.GetBlock(r.Topic, p)
			if block == nil {
				return nil, errors.New("no block for a partition asked for")
			}
			if block.Err != sarama.ErrNoError {
				return nil, block.Err
			}
			out[p] = block.Offset
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown op %s", r.Op)
}

func offsets(r *Request) (interface{}, error) {
	c, err := getClient()
	if err != nil {
		return nil, err
	}
	oldest, err := c.GetOffset(r.Topic, r.Partition, sarama.OffsetOldest)
	if err != nil {
		return nil, err
	}
	newest, err := c.GetOffset(r.Topic, r.Partition, sarama.OffsetNewest)
	return map[string]int64{"oldest": oldest, "newest": newest}, err
}

func produce(r *Request) (interface{}, error) {
	config := newConfig()
	config.Producer.Compression = codecs[r.Compression]
	if r.Idempotent {
		config.Producer.Idempotent = true
		config.Net.MaxOpenRequests = 1
	}
	producer, err := sarama.NewSyncProducer([]string{*bootstrap}, config)
	if err != nil {
		return nil, err
	}
	defer producer.Close()
	messages := []*sarama.ProducerMessage{}
	for _, m := range r.Messages {
		pm := &sarama.ProducerMessage{Topic: r.Topic}
		if m.Key != nil {
			pm.Key = sarama.StringEncoder(*m.Key)
		}
		if m.Value != nil {
			pm.Value = sarama.StringEncoder(*m.Value)
		}
		for _, h := range m.Headers {
			pm.Headers = append(pm.Headers, sarama.RecordHeader{Key: []byte(h[0]), Value: []byte(h[1])})
		}
		messages = append(messages, pm)
	}
	if err := producer.SendMessages(messages); err != nil {
		return nil, err
	}
	out := []map[string]interface{}{}
	for _, m := range messages {
		out = append(out, map[string]interface{}{"partition": m.Partition, "offset": m.Offset})
	}
	return out, nil
}

func keep(m *sarama.ConsumerMessage) Kept {
	kept := Kept{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Headers: map[string][]string{}}
	if m.Key != nil {
		key := string(m.Key)
		kept.Key = &key
	}
	if m.Value != nil {
		value := string(m.Value)
		kept.Value = &value
	}
	for _, h := range m.Headers {
		kept.Headers[string(h.Key)] = append(kept.Headers[string(h.Key)], string(h.Value))
	}
	return kept
}

func consume(r *Request) (interface{}, error) {
	consumer, err := sarama.NewConsumer([]string{*bootstrap}, newConfig())
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(r.Topic, r.Partition, r.Offset)
	if err != nil {
		return nil, err
	}
	defer pc.Close()
	out := []Kept{}
	deadline := time.After(time.Duration(r.TimeoutMs) * time.Millisecond)
	for int32(len(out)) < r.Count {
		select {
		case m := <-pc.Messages():
			out = append(out, keep(m))
		case err := <-pc.Errors():
			return nil, err
		case <-deadline:
			return out, nil
		}
	}
	return out, nil
}

func commit(r *Request) (interface{}, error) {
	c, err := getClient()
	if err != nil {
		return nil, err
	}
	om, err := sarama.NewOffsetManagerFromClient(r.Group, c)
	if err != nil {
		return nil, err
	}
	pom, err := om.ManagePartition(r.Topic, r.Partition)
	if err != nil {
		return nil, err
	}
	pom.MarkOffset(r.Offset, "")
	if err := pom.Close(); err != nil {
		return nil, err
	}
	return true, om.Close()
}

func committed(r *Request) (interface{}, error) {
	c, err := getClient()
	if err != nil {
		return nil, err
	}
	om, err := sarama.NewOffsetManagerFromClient(r.Group, c)
	if err != nil {
		return nil, err
	}
	defer om.Close()
	pom, err := om.ManagePartition(r.Topic, r.Partition)
	if err != nil {
		return nil, err
	}
	defer pom.Close()
	offset, _ := pom.NextOffset()
	return offset, nil
}

// member is one consumer group member: a goroutine calling Consume until stopped.
type member struct {
	group    sarama.ConsumerGroup
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	kept     []Kept
	sessions int
	memberID string
	gen      int32
	claims   map[string][]int32
	failure  error
}

func (m *member) Setup(s sarama.ConsumerGroupSession) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sessions++
	m.memberID, m.gen, m.claims = s.MemberID(), s.GenerationID(), s.Claims()
	return nil
}

func (m *member) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (m *member) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		m.mu.Lock()
		m.kept = append(m.kept, keep(msg))
		m.mu.Unlock()
		s.MarkMessage(msg, "")
	}
	return nil
}

func groupStart(r *Request) (interface{}, error) {
	group, err := sarama.NewConsumerGroup([]string{*bootstrap}, r.Group, newConfig())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{group: group, cancel: cancel, done: make(chan struct{})}
	members[r.Name] = m
	go func() {
		for err := range group.Errors() {
			log.Printf("group %s: %v", r.Name, err)
		}
	}()
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			if err := group.Consume(ctx, r.Topics, m); err != nil {
				m.mu.Lock()
				m.failure = err
				m.mu.Unlock()
				return
			}
		}
	}()
	return true, nil
}

func findMember(name string) (*member, error) {
	m, ok := members[name]
	if !ok {
		return nil, fmt.Errorf("no group member named %s", name)
	}
	return m, nil
}

func groupTake(r *Request) (interface{}, error) {
	m, err := findMember(r.Name)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(time.Duration(r.TimeoutMs) * time.Millisecond)
	for {
		m.mu.Lock()
		if int32(len(m.kept)) >= r.Count || time.Now().After(deadline) || m.failure != nil {
			n := len(m.kept)
			if int32(n) > r.Count {
				n = int(r.Count)
			}
			taken := append([]Kept{}, m.kept[:n]...)
			m.kept = m.kept[n:]
			failure := m.failure
			m.mu.Unlock()
			return taken, failure
		}
		m.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
}

func groupState(r *Request) (interface{}, error) {
	m, err := findMember(r.Name)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return map[string]interface{}{"sessions": m.sessions, "memberId": m.memberID, "generationId": m.gen, "claims": m.claims}, m.failure
}

func groupStop(r *Request) (interface{}, error) {
	m, err := findMember(r.Name)
	if err != nil {
		return nil, err
	}
	delete(members, r.Name)
	m.cancel()
	err = m.group.Close()
	<-m.done
	return true, err
}

var ops = map[string]func(*Request) (interface{}, error){
	"offsets": offsets, "produce": produce, "consume": consume, "commit": commit, "committed": committed,
	"groupStart": groupStart, "groupTake": groupTake, "groupState": groupState, "groupStop": groupStop,
}

func main() {
	flag.Parse()
	sarama.Logger = log.New(os.Stderr, "[sarama] ", log.LstdFlags|log.Lmicroseconds)
	log.SetOutput(os.Stderr)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		r := &Request{}
		if err := json.Unmarshal(in.Bytes(), r); err != nil {
			log.Fatal(err)
		}
		op, ok := ops[r.Op]
		if !ok {
			op = adminOp
		}
		result, err := op(r)
		if err != nil {
			out.Encode(map[string]interface{}{"ok": false, "error": describeError(err)})
		} else {
			out.Encode(map[string]interface{}{"ok": true, "result": result})
		}
	}
	for _, m := range members {
		m.cancel()
		m.group.Close()
	}
	if client != nil {
		client.Close()
	}
}
