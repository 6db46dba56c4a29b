// Package egress is the HTTP proxy that is the only destination a
// sandbox's network can reach. It runs inside the airlock server process;
// the firewall and CNI setup that force sandbox traffic to it live
// elsewhere.
//
// Each run's sandbox connects from its own source address, which
// Server.Register maps to the run id and a Policy. A connection from any
// other address is refused with 403. The proxy speaks two request forms,
// one request per client connection:
//
//   - CONNECT host:port, for TLS;
//   - absolute-URI plain HTTP (GET http://host/path), forwarded upstream
//     without hop-by-hop and Proxy-* headers.
//
// Every destination passes, in order: the policy's name or IP-literal
// check, its port check, resolution by the proxy itself (a static host map
// first, then the Resolver), and a check that none of the resolved
// addresses is loopback, private, link-local, CGNAT, multicast, metadata or
// otherwise special. The proxy then dials the vetted address, never the
// name again, so DNS rebinding cannot change the destination after the
// check.
//
// A CONNECT tunnel, on any port, must begin with a TLS ClientHello whose
// SNI equals the CONNECT host; anything else closes it before a byte
// reaches upstream. Bytes the proxy cannot read could carry anything to an
// allowed address: plain HTTP with a Host header naming another site of
// the same front end, say. Plain HTTP uses the absolute-URI form instead,
// where the proxy sets Host; protocols that are neither (SSH, SMTP) are
// not carried. The ClientHello is parsed from the stream without
// terminating TLS; the bytes read are forwarded before the splice
// continues.
//
// Refusals by policy are recorded per run (Server.Denials) with one of the
// Reason constants and answered with 403 carrying the reason in the status
// text and the body, except an SNI refusal, which comes after the CONNECT's
// 200 and can only close the tunnel. Every connection is logged once, when
// it ends.
package egress
