#!/bin/sh
# One contributor container of docker-compose.yml (workers and validators scale with replicas, so each
# replica makes its own key): on first start a fresh encrypted keystore, funded from anvil's faucet
# (local devnets only), then `worker` stakes and works, `validator` stakes and validates. The trainer's
# dialable address arrives in /bootstrap/trainer; this container registers its own container IP.
set -eu
role="$1"
shift
if [ ! -f "$ROLLNET_HOME/keys/default.json" ]; then
    rollnet keys new
    rollnet chain fund --amount 20
fi
advertise="/ip4/$(hostname -i | cut -d' ' -f1)/tcp/4001"
common="--job latest --model /opt/rollnet/base-model --listen /ip4/0.0.0.0/tcp/4001 --advertise $advertise"
case "$role" in
    worker)
        rollnet node status | grep -q "peer id" || rollnet node join --stake 10
        exec rollnet node work $common --leases 0 --serve 0 --bootstrap @/bootstrap/trainer "$@"
        ;;
    validator)
        exec rollnet validator run $common --stake 10 --bootstrap @/bootstrap/trainer "$@"
        ;;
    *)
        echo "usage: compose-node.sh worker|validator [extra options]" >&2
        exit 2
        ;;
esac
