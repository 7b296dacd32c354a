"""A TLS-terminating proxy in front of the test collector (rotel-agent's receivers speak plain
TCP only): accepts TLS on 127.0.0.1:LISTEN with the given server certificate, offers the given
ALPN protocols (h2 for gRPC, http/1.1 for OTLP/HTTP), optionally requires a client certificate
signed by CLIENT_CA (mTLS), and forwards the decrypted bytes to 127.0.0.1:UPSTREAM.

usage: tls_proxy.py LISTEN UPSTREAM CERT KEY ALPN[,ALPN] [CLIENT_CA]

Python's ssl module is OpenSSL: an implementation independent of the rustls under test. Blocking
sockets, a thread per direction: a refused handshake's alert (certificate required, unknown CA)
reaches the client before the connection closes, as a collector's TLS stack sends it."""

import socket
import ssl
import sys
import threading


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(ctx, raw, upstream):
    conn = ctx.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
    try:
        conn.do_handshake()
    except (ssl.SSLError, OSError) as e:
        print(f"tls_proxy: handshake refused: {e}", flush=True)
        # The alert is written; close gently (half-close, drain what the client already sent)
        # so that unread bytes do not turn the close into a reset that overtakes the alert.
        try:
            socket.socket.shutdown(conn, socket.SHUT_WR)
            conn.settimeout(2)
            while socket.socket.recv(conn, 65536):
                pass
        except OSError:
            pass
        conn.close()
        return
    try:
        up = socket.create_connection(("127.0.0.1", upstream))
    except OSError:
        conn.close()
        return
    t = threading.Thread(target=pipe, args=(up, conn), daemon=True)
    t.start()
    pipe(conn, up)
    t.join()
    conn.close()
    up.close()


def main():
    listen, upstream, cert, key, alpn = sys.argv[1:6]
    client_ca = sys.argv[6] if len(sys.argv) > 6 else None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(alpn.split(","))
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(client_ca)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", int(listen)))
    srv.listen(64)
    print(f"tls_proxy: listening on {listen}", flush=True)
    while True:
        raw, _ = srv.accept()
        threading.Thread(target=serve, args=(ctx, raw, int(upstream)), daemon=True).start()


main()
