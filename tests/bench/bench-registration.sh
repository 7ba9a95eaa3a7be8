#!/usr/bin/env bash
# Prints the application-service registration myelin-bench's scenarios 11 to 14 register
# their users through, for the as_token given: no URL (nothing is pushed to it), a users
# namespace that is not exclusive and holds only those users (`@{prefix}{tag}big{n}`: the
# prefix `b` and hex digits, a scenario's tag of lowercase letters), so nothing else on the
# server changes.
# Myelin (MYELIN_APPSERVICES) and Synapse (app_service_config_files) both take it.
set -euo pipefail
as_token="$1"
hs_token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
cat <<YAML
id: myelin-bench
url: null
as_token: $as_token
hs_token: $hs_token
sender_localpart: myelin-bench
rate_limited: false
namespaces:
  users:
    - exclusive: false
      regex: '@b[0-9a-z]+big[0-9]+:.*'
YAML
