#!/bin/bash
set -e
useradd --system --user-group --shell /usr/sbin/nologin ingest
install -d -o ingest -g ingest -m 750 /var/log/ingest
install -o ingest -g ingest -m 640 /dev/null /var/log/ingest/ingest.log
install -d -m 755 /etc/ingest
printf 'log_dir=/var/log/ingest\nuser=ingest\n' > /etc/ingest/ingest.conf
chmod 644 /etc/ingest/ingest.conf
echo done
