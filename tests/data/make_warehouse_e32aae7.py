"""Made once with deltabus at commit e32aae7 (round 1's table layout): a small warehouse
for the migration test. Run from that checkout: python make.py OUT"""
import sys, time
from deltabus import PublisherClient, SubscriberClient
from deltabus.storage import open_engine
from deltabus import backlog

out = sys.argv[1]
pub = PublisherClient(out, create_warehouse=True)
topic = pub.create_topic(name="projects/p/topics/orders")
sub = SubscriberClient(out, allow_http=True)
sub.create_subscription(name="projects/p/subscriptions/pull-sub", topic="projects/p/topics/orders", ack_deadline_seconds=30, labels={"team": "data"})
sub.create_subscription(name="projects/p/subscriptions/push-sub", topic="projects/p/topics/orders",
                        push_config={"push_endpoint": "http://127.0.0.1:9/push", "oidc_token": {"service_account_email": "a@b.c"}})
for i in range(6):
    pub.publish("projects/p/topics/orders", f"m{i}".encode(), seq=str(i)).result()
# pull 4: ack 1, nack 1, keep 2 leased (their 30 s leases long expired when the test reads them)
resp = sub.pull(subscription="projects/p/subscriptions/pull-sub", max_messages=4, return_immediately=True)
ids = [r.ack_id for r in resp.received_messages]
assert len(ids) == 4, ids
sub.acknowledge(subscription="projects/p/subscriptions/pull-sub", ack_ids=ids[:1])
sub.modify_ack_deadline(subscription="projects/p/subscriptions/pull-sub", ack_ids=ids[1:2], ack_deadline_seconds=0)
sub.refresh_backlog()
pub.close(); sub.close()
print("ok")
