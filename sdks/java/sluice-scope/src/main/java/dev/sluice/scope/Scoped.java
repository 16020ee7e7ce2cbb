package dev.sluice.scope;

import dev.restate.common.RequestBuilder;
import dev.restate.sdk.common.HandlerRequest;
import java.util.Optional;

/**
 * Scoped calls for Restate Java and Kotlin handlers (SDK 2.x, protocol V6) behind Sluice.
 *
 * <p>Protocol V6 has no scope or limit-key fields on a call; Sluice reads them from the call's
 * headers instead, checks them as it checks the fields, and holds the call to the rule book of
 * that scope and key. A call that names no scope inherits its caller's. A handler running in a
 * scope finds its own scope and limit key in its input's headers, which Sluice sets (a client
 * cannot forge them).
 *
 * <pre>{@code
 * // Java
 * ctx.send(Scoped.scope(MeterHandlers.hold(300), "acme", "gold"));
 * Optional<String> mine = Scoped.scopeOf(ctx.request());
 * // Kotlin
 * ctx.send(Scoped.scope(holdRequest, "acme", "gold"))
 * val mine = Scoped.scopeOf(ctx.request())
 * }</pre>
 */
public final class Scoped {
  /** The header that names a call's scope. */
  public static final String SCOPE_HEADER = "x-service-scope";

  /** The header that names a call's limit key (`l1` or `l1/l2`); only with a scope. */
  public static final String LIMIT_KEY_HEADER = "x-service-limit-key";

  /** Longest name Sluice takes: a scope, or each level of a limit key. */
  public static final int MAX_NAME_LENGTH = 36;

  private Scoped() {}

  /** `request` made in scope `scope`, with no limit key. */
  public static <Req, Res> RequestBuilder<Req, Res> scope(
      RequestBuilder<Req, Res> request, String scope) {
    return request.header(SCOPE_HEADER, checked("scope", scope));
  }

  /** `request` made in scope `scope` under limit key `limitKey` (`l1` or `l1/l2`). */
  public static <Req, Res> RequestBuilder<Req, Res> scope(
      RequestBuilder<Req, Res> request, String scope, String limitKey) {
    return scope(request, scope).header(LIMIT_KEY_HEADER, checked("limit key", limitKey));
  }

  /** The scope the running handler was called in, if any. */
  public static Optional<String> scopeOf(HandlerRequest request) {
    return header(request, SCOPE_HEADER);
  }

  /** The limit key the running handler was called under, if any. */
  public static Optional<String> limitKeyOf(HandlerRequest request) {
    return header(request, LIMIT_KEY_HEADER);
  }

  private static Optional<String> header(HandlerRequest request, String name) {
    return Optional.ofNullable(request.headers().get(name)).filter(v -> !v.isEmpty());
  }

  /**
   * What Sluice would refuse anyway (400 `RT0024`), refused here with a message that names it:
   * an empty name, one longer than {@link #MAX_NAME_LENGTH}, a character outside `[a-zA-Z0-9_.-]`,
   * or more levels than a scope (one) or a limit key (two, `l1/l2`) has.
   */
  private static String checked(String what, String value) {
    if (value == null || value.isEmpty()) {
      throw new IllegalArgumentException("the " + what + " is empty");
    }
    String[] levels = value.split("/", -1);
    int most = "limit key".equals(what) ? 2 : 1;
    if (levels.length > most) {
      throw new IllegalArgumentException(
          "the " + what + " '" + shown(value) + "' has more than " + most + " level(s)");
    }
    for (String level : levels) {
      if (level.isEmpty() || level.length() > MAX_NAME_LENGTH) {
        throw new IllegalArgumentException(
            "each level of the " + what + " '" + shown(value) + "' is 1 to "
                + MAX_NAME_LENGTH + " characters");
      }
      for (int i = 0; i < level.length(); i++) {
        char c = level.charAt(i);
        boolean allowed =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
                || c == '_' || c == '.' || c == '-';
        if (!allowed) {
          throw new IllegalArgumentException(
              "the " + what + " '" + shown(value) + "' may hold only [a-zA-Z0-9_.-]");
        }
      }
    }
    return value;
  }

  /** At most 64 characters of `value`: a message does not repeat a huge input. */
  private static String shown(String value) {
    return value.length() <= 64 ? value : value.substring(0, 64) + "…";
  }
}
