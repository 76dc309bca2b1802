"""The service account, its log directory and its configuration, as root set them up."""

import grp
import os
import pwd
import stat


def test_a_system_user_without_login():
    user = pwd.getpwnam("ingest")
    assert user.pw_shell == "/usr/sbin/nologin"
    assert user.pw_uid < 1000, "a system user has a uid below 1000"


def test_the_log_directory_belongs_to_the_account():
    user, group = pwd.getpwnam("ingest"), grp.getgrnam("ingest")
    for path, mode in (("/var/log/ingest", 0o750), ("/var/log/ingest/ingest.log", None)):
        st = os.stat(path)
        assert (st.st_uid, st.st_gid) == (user.pw_uid, group.gr_gid), path
        if mode is not None:
            assert stat.S_IMODE(st.st_mode) == mode


def test_the_configuration():
    st = os.stat("/etc/ingest/ingest.conf")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644)
    assert open("/etc/ingest/ingest.conf").read() == "log_dir=/var/log/ingest\nuser=ingest\n"
