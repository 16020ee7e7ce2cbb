package dev.sluice.scope;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.restate.common.Request;
import dev.restate.common.Target;
import dev.restate.sdk.common.HandlerRequest;
import java.util.Map;
import java.util.Optional;
import org.junit.jupiter.api.Test;

class ScopedTest {
  private static Request<byte[], byte[]> request(String scope, String key) {
    var builder = Request.of(Target.service("Meter", "hold"), new byte[0]);
    return key == null ? Scoped.scope(builder, scope).build() : Scoped.scope(builder, scope, key).build();
  }

  @Test
  void aScopedRequestCarriesTheHeadersSluiceReads() {
    assertEquals(Map.of("x-service-scope", "acme"), request("acme", null).getHeaders());
    assertEquals(
        Map.of("x-service-scope", "acme", "x-service-limit-key", "gold/eu"),
        request("acme", "gold/eu").getHeaders());
  }

  @Test
  void whatSluiceWouldRefuseIsRefusedHereByName() {
    for (String[] bad :
        new String[][] {
          {"", null, "empty"},
          {"a/b", null, "more than 1 level"},
          {"acme", "a/b/c", "more than 2 level"},
          {"acme", "gold/", "1 to 36"},
          {"x".repeat(37), null, "1 to 36"},
          {"ac me", null, "[a-zA-Z0-9_.-]"},
          {"acme", "göld", "[a-zA-Z0-9_.-]"},
        }) {
      var thrown = assertThrows(IllegalArgumentException.class, () -> request(bad[0], bad[1]));
      assertTrue(thrown.getMessage().contains(bad[2]), thrown.getMessage());
    }
  }

  @Test
  void aHandlerReadsItsOwnScopeAndKeyFromItsInputsHeaders() {
    var mine =
        new HandlerRequest(
            null, null, null, Map.of("x-service-scope", "acme", "x-service-limit-key", "gold"));
    assertEquals(Optional.of("acme"), Scoped.scopeOf(mine));
    assertEquals(Optional.of("gold"), Scoped.limitKeyOf(mine));
    var none = new HandlerRequest(null, null, null, Map.of());
    assertEquals(Optional.empty(), Scoped.scopeOf(none));
  }
}
