"""Makes a generated Synapse homeserver.yaml fit for the benchmarks: one client listener on
loopback, PostgreSQL, registration open with cheap password hashing (set-up, not measured),
rate limits out of the way, no federation, and the benchmark's application service.

Usage: python synapse_config.py HOMESERVER_YAML PORT PGUSER PGHOST DATABASE REGISTRATION_YAML
       python synapse_config.py --workers HOMESERVER_YAML REPLICATION_PORT
The second form makes a configuration written by the first one the main process of a
scale-out: a replication listener on loopback and Redis at 127.0.0.1:6379, which Synapse's
generic workers need (tests/bench/scale_out.sh writes the workers' own files).
"""
import sys

import yaml

if sys.argv[1] == "--workers":
    path, replication_port = sys.argv[2:4]
    config = yaml.safe_load(open(path))
    config["listeners"].append({"port": int(replication_port), "bind_addresses": ["127.0.0.1"],
                                "type": "http", "tls": False,
                                "resources": [{"names": ["replication"], "compress": False}]})
    config["instance_map"] = {"main": {"host": "127.0.0.1", "port": int(replication_port)}}
    config["redis"] = {"enabled": True, "host": "127.0.0.1", "port": 6379}
    yaml.safe_dump(config, open(path, "w"))
    sys.exit(0)

path, port, user, host, database, registration = sys.argv[1:7]
config = yaml.safe_load(open(path))
config["listeners"] = [{"port": int(port), "bind_addresses": ["127.0.0.1"], "type": "http", "tls": False,
                        "x_forwarded": False, "resources": [{"names": ["client"], "compress": False}]}]
config["database"] = {"name": "psycopg2", "args": {"user": user, "host": host, "database": database,
                                                    "cp_min": 5, "cp_max": 10}}
config["enable_registration"] = True
# Registration is set-up, not a measured scenario: cheap password hashing keeps the run short.
config["bcrypt_rounds"] = 4
config["enable_registration_without_verification"] = True
unlimited = {"per_second": 100000, "burst_count": 100000}
for key in ["rc_message", "rc_registration", "rc_3pid_validation", "rc_admin_redaction",
            "rc_presence", "rc_delayed_event_mgmt", "rc_joins_per_room", "rc_room_creation",
            "rc_reports", "rc_media_create", "rc_third_party_invite"]:
    config[key] = unlimited
config["rc_login"] = {"address": unlimited, "account": unlimited, "failed_attempts": unlimited}
config["rc_joins"] = {"local": unlimited, "remote": unlimited}
config["rc_invites"] = {"per_room": unlimited, "per_user": unlimited, "per_issuer": unlimited}
config["federation_domain_whitelist"] = []
config["trusted_key_servers"] = []
config["app_service_config_files"] = [registration]
yaml.safe_dump(config, open(path, "w"))
