# obsspec Harbor supervisor: PID 1 of a container with Harbor semantics (obsspec/env/semantics.py),
# running the execute-only bash from the image's own root, which stays read-only and pristine,
# as the container's root (a user namespace: no host privileges) with the agent's capabilities
# and SYS_ADMIN. The protocol on stdin/stdout is supervisor.sh's: untar, raw, run, reset, verify,
# reward, each answered by its output and the end marker \0NONCE RC\0.
#
# Three worlds (scripts/world.py makes them):
# - the agent's: its own mount and PID namespaces over $R, an overlay whose lower layer is the
#   image and whose upper layer, $U (a tmpfs of the task's storage size), holds every change;
#   its PID 1 is the spawner (scripts/world.py), which runs commands and keeps services;
# - the verifier's: made at `verify` (world.py verifier): the agent's files, live, with the
#   image's system directories, and /tests and /logs of $W, which no agent process ever sees;
# - ours: this shell, the relay (scripts/relay.py, the terminal every agent process writes to)
#   and the janitor, none of which any agent process can see, signal or trace.
# Nothing is killed between commands or before the verifier: services live on. A command that
# times out (SIGUSR1 from the harness) loses its shell, and what it started runs on, as in a
# terminal; a verifier that times out is killed with everything it started.
# From `reset` until the verifier starts, the agent's processes are stopped (SIGSTOP): they can
# take neither the CPU, nor process slots, nor change what the janitor looks at, while the
# harness works. More threads than max_procs (possible across users: the process limit is per
# uid) are killed there. They run again beside the verifier only when it may need their services
# (OBSSPEC_SERVICES=1: semantics.needs_services, or sandbox.harbor_services); else they stay
# stopped, and no live process can time the verifier. After it, they are all killed.
# Everything here runs on bash builtins until the agent's processes are stopped: forking is what
# a full process table takes from us.

export OBSSPEC_LC_ALL=$LC_ALL
export LC_ALL=C   # read -N counts bytes
ulimit -u "$OBSSPEC_HARNESS_PROCS"
S=$OBSSPEC_STATE_DIR U=/run/obsspec/upper R=/run/obsspec/root W=/run/obsspec/verify

# -- start: the agent's world, the relay, the image's ENTRYPOINT/CMD (by the spawner)
for f in cmd status ctl ack term vready; do mkfifo -m 0600 "$S/$f" || exit 1; done
exec 5<>"$S/cmd" 6<>"$S/status" 7<>"$S/ctl" 8<>"$S/ack" 9<>"$S/vready"
python3 -I -c "$OBSSPEC_RELAY" 3<>"$S/term" 4<>"$S/ctl" 5<>"$S/ack" 6<&- 7>&- 8<&- 9<&- </dev/null &
relay=$!
python3 -I -c "$OBSSPEC_WORLD" agent "$U" "$R" "$OBSSPEC_WORKDIR" \
  3<>"$S/cmd" 4<>"$S/status" 5<>"$S/term" 6<&- 7>&- 8<&- 9<&- </dev/null >/dev/null 2>"$S/world.log" &
world=$!
ours=" 1 $$ $relay $world "
# the spawner says it is ready; else the world could not be made (its error, and we end)
if ! read -r -t 60 ready <&6 || [ "$ready" != ready ]; then
  echo "obsspec: the agent's world did not start: $(tr '\n' ' ' < "$S/world.log")" >&2
  exit 1
fi
read -r spawner < "/proc/$world/task/$world/children"
exec 2>/dev/null

stopped=()
# Stop every process of the container but ours, until a pass finds no thread of theirs running (a
# stopped process forks no more); count their threads (the container's process limit counts
# threads, and the per-uid limit lets an agent that switches uids hold many). Threads decide, not
# the process's first line: a main thread that exited alone shows Z while the rest run on. Ones the
# agent had stopped itself stay out of `stopped`.
stop_agent() {
  local d t p line state pass=0 running=1 count live
  while [ "$running" = 1 ] && [ "$pass" -lt 500 ]; do
    running=0 count=0 pass=$((pass + 1))
    for d in /proc/[0-9]*; do
      p=${d#/proc/}
      case $ours in *" $p "*) continue ;; esac
      live=0
      for t in "$d"/task/[0-9]*; do
        IFS= read -r line < "$t/stat" || continue
        state=${line##*) }; state=${state%% *}
        case $state in
          Z|X) ;;
          T|t) count=$((count + 1)) ;;
          *) count=$((count + 1)); live=1 ;;
        esac
      done
      if [ "$live" = 1 ]; then kill -STOP "$p" && stopped+=("$p"); running=1; fi
    done
    [ "$running" = 1 ] && read -r -t 0.01 _ <&9
  done
  agent_count=$count
  # (not all stopped after 500 passes: none may run beside the verifier, so all are ended)
  unstopped=$running
  [ "$running" = 1 ] && kill_agent
  return 0
}
cont_agent() { local p; for p in "${stopped[@]}"; do kill -CONT "$p"; done; stopped=(); }
kill_agent() {
  local d p
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case $ours in *" $p "*) ;; *) kill -KILL "$p" ;; esac
  done
  stopped=()
}

__busy="" __interrupted=0 __verified=0 vpid=0
__interrupt() {
  __interrupted=1
  case $__busy in run) kill -USR1 "$spawner" ;; verify) kill -KILL "$vpid" ;; esac
}
trap __interrupt USR1

while IFS=' ' read -r op nonce nbytes arg; do
  script=""
  if [ "$op" = untar ]; then
    # the task's files (before the agent's first command) or the verifier's (out of its sight)
    case $arg in workspace) dir=$R$OBSSPEC_WORKDIR ;; tests) dir=$W/tests ;; *) dir=/nonexistent ;; esac
    mkdir -p -- "$dir"
    head -c "$nbytes" | { msg=$(tar -x --no-same-owner -C "$dir" 2>&1); r=$?; cat >/dev/null
                          printf '%s' "${msg%%$'\n'*}"; exit "$r"; }
    printf '\0%s %d\0' "$nonce" "$?"
    continue
  fi
  [ "$nbytes" -gt 0 ] && IFS= read -r -d '' -N "$nbytes" script
  __interrupted=0
  case $op in
    run|raw)
      printf 'start %s\n' "$nonce" >&7
      printf '%s %s %d %s\n%s' "$op" "$nonce" "$nbytes" "$arg" "$script" >&5
      __busy=run
      until read -r done rc <&6 && [ "$done" = "$nonce" ]; do :; done
      __busy=""
      printf 'end %s %d\n' "$nonce" "$rc" >&7
      read -r -N 1 _ <&8  # (the relay wrote the command's output and its marker)
      continue ;;
    reset)
      # The agent's processes stop (past max_procs, across users, they are killed); the
      # verifier's area starts empty; the agent's links into /tests, /logs and /proc go
      # (rc 4: something could not be undone, scored 0; rc 5: the janitor could not run).
      stop_agent
      [ "$unstopped" = 1 ] && echo "the agent's processes did not all stop: all were ended before the verifier"
      if [ "$agent_count" -gt "$OBSSPEC_MAX_PROCS" ]; then
        kill_agent
        echo "the agent ran $agent_count threads (more than $OBSSPEC_MAX_PROCS, across users): all were ended before the verifier"
      fi
      find "$W" -mindepth 1 -delete && mkdir -p "$W/tests" "$W/logs/verifier" || { printf '\0%s %d\0' "$nonce" 5; continue; }
      python3 -I -c "$OBSSPEC_JANITOR" harbor "$U/u" "$R" before </dev/null 2>&1
      rc=$?
      # (137: the OOM killer, in memory the agent's files and services hold: scored 0)
      [ "$rc" = 137 ] && { echo "the janitor ran out of memory the agent's files and services hold"; rc=4; }
      [ "$rc" = 0 ] || [ "$rc" = 4 ] || rc=5
      printf '\0%s %d\0' "$nonce" "$rc"
      continue ;;
    verify)
      __verified=0
      python3 -I -c "$OBSSPEC_WORLD" verifier "$R" "$W" "$OBSSPEC_WORKDIR" \
        </dev/null 3< <(printf '%s' "$script") 4>&9 2>&1 5>&- 6<&- 7>&- 8<&- 9<&- &
      vpid=$! __busy=verify
      # the agent's processes run again when the verifier's view is made (it says so on fd 4), if
      # the verifier may need its services; else they stay stopped until they are killed
      until read -r -t 0.05 -N 1 _ <&9 || ! kill -0 "$vpid"; do :; done
      [ "$OBSSPEC_SERVICES" = 1 ] && cont_agent
      wait "$vpid"; rc=$?
      while [ "$__interrupted" = 1 ] && kill -0 "$vpid" 2>/dev/null; do wait "$vpid"; rc=$?; done
      __busy=""
      # (an interrupted run, or one that ended by a signal, is judged by its exit status: code of
      # the agent's that the verifier ran could have written the reward file and then made the
      # run time out, or killed the shell running test.sh)
      [ "$__interrupted" = 0 ] && [ "$rc" -lt 128 ] && __verified=1
      printf '\0%s %d\0' "$nonce" "$rc"
      continue ;;
    reward)
      # The episode is over: the agent's processes end. They lived on while the verifier ran: a
      # link into its files made meanwhile (found by the janitor's second sweep) taints the
      # verdict: rc 4, scored 0. Else the janitor prints the reward file, read without
      # following links (rc 3: none; a verifier run that was interrupted or signalled: rc 3).
      stop_agent; kill_agent
      out=$(python3 -I -c "$OBSSPEC_JANITOR" harbor "$U/u" "$R" after "$W" </dev/null 2>/dev/null); rc=$?
      case $rc in
        0) [ "$__verified" = 1 ] && printf '%s' "$out" || rc=3 ;;
        3) ;;
        *) rc=4 ;;
      esac
      printf '\0%s %d\0' "$nonce" "$rc"
      continue ;;
    *) printf '\0%s %d\0' "$nonce" 2; continue ;;
  esac
done
