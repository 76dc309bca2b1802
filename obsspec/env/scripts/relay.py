# obsspec Harbor relay: the episode's terminal, run by PID 1 of a Harbor container
# (scripts/supervisor_harbor.sh) where no agent process can see it.
#
#   python3 -I -c "$OBSSPEC_RELAY"    fd 3: the terminal (read and write), fd 4: control lines
#                                      from PID 1, fd 5: acknowledgements to it, fd 1: the harness
#
# Every agent process writes to the terminal, and background ones (services) keep writing after
# their command has returned. The relay drains it all the time, so that no writer ever blocks on
# a full pipe, and forwards to the harness only while a command runs: `start NONCE` opens a
# command, `end NONCE RC` closes it: what is in the terminal then is forwarded, then the end
# marker \0NONCE RC\0, then one byte to PID 1 on fd 5. Output after that (a service's log line)
# is dropped. No agent process holds the harness's pipe: nothing it does reaches a marker, the
# reward, or a later request's answer.

import os
import select

TERM, CONTROL, ACK = 3, 4, 5


def forward(data: bytes) -> None:
    while data:
        data = data[os.write(1, data):]


def drain(active: bool) -> None:
    os.set_blocking(TERM, False)
    try:
        while True:
            chunk = os.read(TERM, 1 << 16)
            if active:
                forward(chunk)
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(TERM, True)


def main() -> None:
    active = False
    pending = b""
    while True:
        ready, _, _ = select.select([TERM, CONTROL], [], [])
        if TERM in ready:
            chunk = os.read(TERM, 1 << 16)
            if active:
                forward(chunk)
        if CONTROL in ready:
            data = os.read(CONTROL, 4096)
            if not data:
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                words = line.split()
                if words[:1] == [b"start"]:
                    drain(False)  # what services wrote between commands is not this one's
                    active = True
                elif words[:1] == [b"end"] and len(words) == 3:
                    drain(active)
                    active = False
                    forward(b"\0" + words[1] + b" " + words[2] + b"\0")
                    os.write(ACK, b"k")


main()
